"""The two README commands on every OS, through Python (Windows PowerShell has no bash):

    py workbook.py run      (Windows)      python3 workbook.py run     (Linux, macOS: same as ./workbook run)
    py workbook.py test                    python3 workbook.py test
    py workbook.py test --platforms        python3 workbook.py test --platforms

Each sets up .venv/ beside this file (PyTorch's CPU build, lessonkit with its dev extras, SmolLM2's weights
through `lessonkit setup`) when it is missing or older than the set-up files, then runs the main job (every
lesson headlessly into build/) or the test suite (without the platform tests; `test --platforms` runs those
alone, as ./workbook does). `--print` shows the commands without running them.
./workbook does the same in bash; a test checks that the two install the same things."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
STAMP = VENV / ".lessonkit-installed"
SETUP_FILES = ("pyproject.toml", "setup.py")
TORCH = "torch==2.13.0"      # PyPI's torch is a CPU build on Windows and macOS; on Linux use ./workbook (README)


def venv_python() -> Path:
    return VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def setup_commands() -> list[list[str]]:
    """The set-up, as ./workbook runs it: pip, torch, lessonkit with dev extras, SmolLM2, the kernel spec."""
    py = str(venv_python())
    pip = [py, "-m", "pip", "install", "--quiet"]
    return [pip + ["--upgrade", "pip"], pip + [TORCH], pip + ["-e", ".[dev]"],
            [py, "-m", "lessonkit", "setup"], [py, "-m", "ipykernel", "install", "--sys-prefix", "--name", "python3"]]


def stale() -> bool:
    if not STAMP.exists():
        return True
    newest = max((ROOT / f).stat().st_mtime for f in SETUP_FILES)
    return newest > STAMP.stat().st_mtime


# ./workbook's pytest runs: the suite on two workers, then its serial tests (they measure wall time) alone; and
# `test --platforms`, the platform tests (wheel venvs, qemu, wine, ThreadSanitizer), which CI runs after the suite
SUITE = [["-n", "2", "--dist", "worksteal", "-m", "not serial and not platforms", "--durations=15"],
         ["-m", "serial and not platforms"]]
PLATFORMS = ["-n", "2", "--dist", "worksteal", "-m", "platforms", "--durations=15"]


def job_commands(job: str, args: list[str]) -> list[list[str]]:
    py = str(venv_python())
    if job == "run":
        return [[py, "-m", "lessonkit", "run", *args]]
    if args[:1] == ["--platforms"]:
        return [[py, "-m", "pytest", "-q", *PLATFORMS, *args[1:]]]
    if args[:1] == ["--long"]:                       # the fuzz layer at full size (main() sets LESSONKIT_FUZZ=long)
        return [[py, "-m", "pytest", "-q", "tests/test_fuzz.py", *args[1:]]]
    if args:
        return [[py, "-m", "pytest", "-q", *args]]
    return [[py, "-m", "pytest", "-q", *job] for job in SUITE]


def main(argv: list[str]) -> int:
    show = "--print" in argv
    argv = [a for a in argv if a != "--print"]
    if not argv or argv[0] not in ("run", "test"):
        print("usage: workbook.py run|test [--platforms | --long] [args] [--print]", file=sys.stderr)
        return 64
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.setdefault("OMP_NUM_THREADS", "1")          # batch-1 decoding is latency-bound (README)
    if argv[1:2] == ["--long"]:
        env["LESSONKIT_FUZZ"] = "long"
    cmds = []
    if show or stale():
        cmds += [[sys.executable, "-m", "venv", str(VENV)]] if not venv_python().exists() or show else []
        cmds += setup_commands()
    cmds += job_commands(argv[0], argv[1:])
    rc = 0
    for i, cmd in enumerate(cmds):
        if show:
            print(" ".join(cmd))
            continue
        r = subprocess.run(cmd, cwd=ROOT, env=env)
        if r.returncode and cmd[2:4] == ["pytest", "-q"] and i + 1 < len(cmds):
            rc = rc or r.returncode                  # the serial tests still run after a failure, as in ./workbook
            continue
        if r.returncode:
            return r.returncode
        if cmd[-3:] == ["--sys-prefix", "--name", "python3"]:
            STAMP.touch()
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
