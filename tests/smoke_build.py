"""One SMOKE main job (`lessonkit run --smoke`) per test session, shared by the tests of its report
(test_runner.py, test_report_browser.py). Under pytest-xdist the first worker that asks runs it and
the others wait on a lock beside their temporary folders, so it runs once wherever the tests land."""
from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from lessonkit.report.runner import run_all

# whichever test asks first waits for the whole SMOKE main job (every lesson once, 3-5 min on 2 shared cores):
# the modules that read it take this budget (tests/conftest.py) instead of 60 s
SMOKE_BUDGET = pytest.mark.budget(360, "the first test to ask for smoke_build runs the SMOKE main job for the session")


@pytest.fixture(scope="session")
def smoke_build(tmp_path_factory) -> tuple[Path, int]:
    """(build folder, exit code) of the session's SMOKE main job."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent          # shared by the workers of this session
    build, done = root / "smoke-main-job", root / "smoke-main-job.rc"
    with open(root / "smoke-main-job.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            done.write_text(str(run_all(build_dir=build, smoke=True)))
    return build, int(done.read_text())
