"""Each test's time budget (tests/conftest.py): BUDGET_S, or budget(seconds, reason) beside a test that needs
more; the run ends with the tests over their budget, after pytest's own --durations list."""
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = '''
import time
import pytest

@pytest.mark.budget(0.05, "a stand-in that overruns")
def test_overruns():
    time.sleep(0.3)

@pytest.mark.budget(30, "a stand-in within its budget")
def test_within():
    time.sleep(0.3)
'''


def run_pytest(tmp_path: Path, tests: str) -> subprocess.CompletedProcess:
    (tmp_path / "tests").mkdir()
    shutil.copy(ROOT / "tests" / "conftest.py", tmp_path / "tests" / "conftest.py")
    (tmp_path / "tests" / "test_stand_in.py").write_text(tests, encoding="utf-8")
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "--rootdir", str(tmp_path), "tests"], cwd=tmp_path, capture_output=True, text=True)


def test_the_run_ends_with_each_test_over_its_budget(tmp_path):
    r = run_pytest(tmp_path, TESTS)
    assert r.returncode == 0, r.stdout + r.stderr
    over = r.stdout[r.stdout.index("over their time budget"):]
    assert "budget 0.05 s  tests/test_stand_in.py::test_overruns" in over, over
    assert "test_within" not in over


def test_a_budget_without_a_reason_is_refused(tmp_path):
    r = run_pytest(tmp_path, "import pytest\n\n@pytest.mark.budget(120)\ndef test_x():\n    pass\n")
    assert r.returncode != 0 and "needs positive seconds and a reason" in r.stdout + r.stderr
