"""The wheel is the workbook: built from this checkout, installed into a fresh virtual environment of each
Python a student may have (3.12 is Colab's), and run from a folder that is not the clone.

- 3.12: `lessonkit setup`, `lessonkit doctor` and the smoke main job (`lessonkit run --smoke`): every lesson
  executes and the report is written;
- 3.11 and 3.13: `lessonkit setup`, `lessonkit doctor` and lesson 00 (`lessonkit run --smoke --only 00`);
- on each: doctor says which kernel binary loaded, and `lessonkit lessons DEST` copies a handout whose
  notebook links reach the copied docs.

PyTorch: the CPU build only, as the set-up installs it (`torch==2.13.0+cpu`: PyPI's Linux torch is the CUDA
build, about 4.5 GB with its CUDA libraries, and carries no `+cpu` tag, so it can never be picked). It comes from
pip's own sources (on this machine kind the CPU wheel lies on disk for Python 3.11) or PyTorch's CPU index,
download.pytorch.org/whl/cpu. Each test skips, saying why, where its Python is missing, and fails instead when
CI is set (CI must run them); where no CPU wheel of torch can be reached it skips in CI too, saying so (the other
torch, PyPI's CUDA build, is never downloaded)."""
from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workbook import TORCH

ROOT = Path(__file__).resolve().parents[1]
TORCH_CPU = [f"{TORCH}+cpu", "--extra-index-url", "https://download.pytorch.org/whl/cpu"]   # see the docstring
pytestmark = pytest.mark.platforms


def _missing(reason: str):
    if os.environ.get("CI"):
        pytest.fail(f"CI must run the platform tests: {reason}")
    pytest.skip(reason)


def find_python(version: str) -> str | None:
    """An interpreter of `version` ("3.12"): on PATH, or pyenv's."""
    candidates = [shutil.which(f"python{version}")] + sorted(
        glob.glob(os.path.expanduser(f"~/.pyenv/versions/{version}.*/bin/python{version}")), reverse=True)
    for c in filter(None, candidates):
        r = subprocess.run([c, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True,
                           text=True, encoding="utf-8")
        if r.returncode == 0 and r.stdout.strip() == version:
            return c
    return None


def run(cmd, *, cwd, env, timeout=1500) -> str:
    r = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, encoding="utf-8",
                       errors="replace", timeout=timeout)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))} exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    """The wheel of this checkout (built once per test session)."""
    out = tmp_path_factory.mktemp("wheel")
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", out, ROOT],
        cwd=out, env=os.environ.copy())
    (whl,) = out.glob("lessonkit-*.whl")
    return whl


def fresh_install(version: str, wheel: Path, tmp: Path) -> tuple[Path, dict]:
    """A new venv of `version` with torch, the wheel and SmolLM2's weights; returns (its python, env)."""
    py = find_python(version)
    if py is None:
        _missing(f"no Python {version} on this machine (pyenv install {version})")
    venv = tmp / f"venv{version}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON", "LESSONKIT"))}
    env.update(LESSONKIT_HOME=str(tmp / "home"), JUPYTER_DATA_DIR=str(tmp / "jupyter"), OMP_NUM_THREADS="1",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PATH=f"{venv / 'bin'}{os.pathsep}{env['PATH']}")
    start = time.perf_counter()
    run([py, "-m", "venv", venv], cwd=tmp, env=env)
    vpy = venv / "bin" / "python"
    pip = [vpy, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    install_cpu_torch(pip, version, cwd=tmp, env=env)
    run(pip + [wheel], cwd=tmp, env=env)
    installed_s = time.perf_counter() - start
    run([vpy, "-m", "ipykernel", "install", "--sys-prefix", "--name", "python3"], cwd=tmp, env=env)
    run([venv / "bin" / "lessonkit", "setup"], cwd=tmp, env=env)
    (tmp / f"install{version}.json").write_text(json.dumps({"seconds": installed_s}), encoding="utf-8")
    return venv, env


def install_cpu_torch(pip: list, version: str, *, cwd: Path, env: dict) -> None:
    """torch's CPU build into a fresh venv, or a skip (a failure in CI) naming what is missing: never the CUDA build."""
    r = subprocess.run([str(c) for c in pip + TORCH_CPU], cwd=cwd, env=env, capture_output=True, text=True,
                       encoding="utf-8", errors="replace", timeout=1500)
    if r.returncode and ("No matching distribution found" in r.stderr or "ResolutionImpossible" in r.stderr):
        # a skip in CI too: CI reaches the package registries only, and PyTorch's CPU index may not be one of
        # them; the only other torch for this Python is PyPI's CUDA build, which this test must never download
        pytest.skip(f"no CPU build of {TORCH} for Python {version} here or at {TORCH_CPU[-1]}")
    assert r.returncode == 0, f"{TORCH_CPU[0]} did not install:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"


def check_installed(venv: Path, env: dict, cwd: Path) -> None:
    """doctor names the kernel binary it loaded from the installed package; the handout's links work."""
    lk = venv / "bin" / "lessonkit"
    out = run([lk, "doctor"], cwd=cwd, env=env)
    assert "kernel" in out and "rowkernel-linux-x86_64" in out, out[-2000:]
    where = run([venv / "bin" / "python", "-c", "import lessonkit; print(lessonkit.workbook_root())"], cwd=cwd, env=env)
    assert "site-packages" in where and str(ROOT) not in where, where
    run([lk, "lessons", cwd / "handout"], cwd=cwd, env=env)
    nb = json.loads((cwd / "handout" / "notebooks" / "04_prefix_cache.ipynb").read_text(encoding="utf-8"))
    assert "../docs/sources.md" in json.dumps(nb) and (cwd / "handout" / "docs" / "sources.md").is_file()


def smoke_run(venv: Path, env: dict, cwd: Path, only: list[str]) -> dict:
    args = [venv / "bin" / "lessonkit", "run", "--smoke", "--build-dir", cwd / "build"]
    for o in only:
        args += ["--only", o]
    out = run(args, cwd=cwd, env=env)
    summary = json.loads((cwd / "build" / "summary.json").read_text(encoding="utf-8"))
    assert (cwd / "build" / "report.html").is_file(), out
    return summary


@pytest.mark.budget(420, "a fresh venv installs the wheel with torch and Jupyter from the pip cache, then runs "
                         "lessons: 190-225 s for lesson 00 alone on 2 cores (CI and a fresh clone, 2026-12-04)")
@pytest.mark.parametrize("version,only", [("3.12", []), ("3.11", ["00"]), ("3.13", ["00"])])
def test_the_wheel_runs_the_lessons_outside_the_clone(version, only, wheel, tmp_path):
    venv, env = fresh_install(version, wheel, tmp_path)
    work = tmp_path / "student"          # an unrelated folder: nothing of the clone is reachable from here
    work.mkdir()
    try:
        check_installed(venv, env, work)
        summary = smoke_run(venv, env, work, only)
    finally:
        shutil.rmtree(venv, ignore_errors=True)   # up to 4.5 GB each: pytest keeps its last temporary folders
    status = {name: s["status"] for name, s in summary["lessons"].items()}
    assert status and all(s == "ok" for s in status.values()), status
    assert len(status) == (8 if not only else 1), status
