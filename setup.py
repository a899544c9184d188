"""The one compiled part: the row-invariant matmul kernel (csrc/rowkernel.c), and on its packed weights a
dense drafter's whole one-token step (dense_step, lessonkit/engine/draft_step.py).

optional=True: on a machine without a C compiler the install still succeeds and the engine runs on
its MKL path (same exactness, slower verify) and drafters take their PyTorch step; `lessonkit doctor` says which path is active."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("lessonkit.engine._rowkernel", ["csrc/rowkernel.c"],
                             extra_compile_args=["-O3", "-std=c11"], optional=True)])
