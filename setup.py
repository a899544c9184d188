"""The one compiled part: the row-invariant matmul kernel (csrc/rowkernel.c; float32 strips and native Q4_1 /
Q8_0 blocks, split over a small thread pool), and on its packed weights a dense drafter's whole one-token step
(dense_step, lessonkit/engine/draft_step.py). -ffp-contract=off: a dequantised weight d * q + m must round twice
(multiply, then add), exactly as the float32 loader computes it, never once in a fused multiply-add.

optional=True: on a machine without a C compiler the install still succeeds and the engine runs on
its MKL path (same exactness, slower verify) and drafters take their PyTorch step; `lessonkit doctor` says which path is active."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("lessonkit.engine._rowkernel", ["csrc/rowkernel.c"],
                             extra_compile_args=["-O3", "-std=c11", "-ffp-contract=off", "-pthread"],
                             extra_link_args=["-pthread"], optional=True)])
