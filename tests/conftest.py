import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# One BLAS/OpenMP thread in tests and in the notebook kernels they start (inherited env): batch-1
# decoding is latency-bound, and on shared cores a second OpenMP thread that gets descheduled makes
# every small op wait for it (measured here: 24 tokens took 7.3 s with 2 threads, 0.13 s with 1).
# Results do not depend on the thread count; only time does.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: takes more than a few seconds")
    config.addinivalue_line("markers", "serial: measures wall time; `./workbook test` runs it alone, after the "
                            "parallel part, so that no other test shares the machine")
    config.addinivalue_line("markers", "platforms: stands for a platform CI cannot run (other OSes, CPUs, Pythons, an "
                            "installed wheel); skips with its reason where a tool is missing, never in CI")
