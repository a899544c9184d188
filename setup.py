"""The one compiled part: the row-invariant matmul kernel (csrc/rowkernel.c).

optional=True: on a machine without a C compiler the install still succeeds and the engine runs on
its MKL path (same exactness, slower verify); `lessonkit doctor` says which path is active."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("lessonkit.engine._rowkernel", ["csrc/rowkernel.c"],
                             extra_compile_args=["-O3", "-std=c11"], optional=True)])
