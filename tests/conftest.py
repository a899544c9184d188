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
    config.addinivalue_line("markers", "budget(seconds, reason): this test may take up to `seconds` (setup, call and "
                            f"teardown together) instead of BUDGET_S = {BUDGET_S:g}; the reason says why it needs more")


BUDGET_S = 60.0       # every test's time budget in the default run, unless it carries budget(seconds, reason)
_spent: dict[str, list] = {}          # nodeid -> [seconds so far, budget]


def budget_of(item) -> float:
    """The test's budget: BUDGET_S, or its budget marker's seconds, which must come with a reason."""
    mark = item.get_closest_marker("budget")
    if mark is None:
        return BUDGET_S
    seconds = mark.args[0] if mark.args else mark.kwargs.get("seconds")
    reason = mark.args[1] if len(mark.args) > 1 else mark.kwargs.get("reason", "")
    if not isinstance(seconds, (int, float)) or seconds <= 0 or not str(reason).strip():
        raise pytest.UsageError(f"{item.nodeid}: budget(seconds, reason) needs positive seconds and a reason")
    return float(seconds)


def pytest_collection_modifyitems(items):
    for item in items:                # user_properties travel with each report from a pytest-xdist worker
        item.user_properties.append(("budget_s", budget_of(item)))


def pytest_runtest_logreport(report):
    budget = dict(report.user_properties).get("budget_s", BUDGET_S)
    _spent.setdefault(report.nodeid, [0.0, budget])[0] += report.duration


def over_budget() -> list[tuple[str, float, float]]:
    return sorted(((n, s, b) for n, (s, b) in _spent.items() if s > b), key=lambda t: -t[1])


def pytest_terminal_summary(terminalreporter):
    over = over_budget()
    if over:
        terminalreporter.section("tests over their time budget (tests/conftest.py: BUDGET_S, budget marker)")
        for nodeid, spent, budget in over:
            terminalreporter.write_line(f"{spent:7.1f} s  budget {budget:g} s  {nodeid}")
