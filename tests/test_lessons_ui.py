"""The lessons as a student meets them (issue 36): notebooks that run wherever they are opened, checks
that point at the student's own line, exercise intros that count their exercises, links that resolve."""
import json
import re
import shutil
from pathlib import Path

import pytest

import lessonkit
from lessonkit.engine.errors import LessonkitError
from lessonkit.exercises import call
from lessonkit.lessons.runner import execute_notebook

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").rglob("*.ipynb"))
NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8}


def _cells(nb: Path, kind: str) -> list[str]:
    return ["".join(c["source"]) for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == kind]


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT / "notebooks")))
def test_no_notebook_locates_the_workbook_through_its_working_directory(nb):
    code = "\n".join(_cells(nb, "code"))
    assert "Path.cwd()" not in code and "sys.path" not in code, "find data through lessonkit.data_dir(), not the cwd"


def test_data_dir_is_found_through_the_package(monkeypatch, tmp_path):
    assert lessonkit.data_dir() == ROOT / "data"
    monkeypatch.setattr(lessonkit, "REPO_ROOT", tmp_path)
    with pytest.raises(LessonkitError, match="pip install -e"):
        lessonkit.data_dir()


@pytest.mark.parametrize("name", ["01_speculative.ipynb", "exercises/01_speculative.ipynb"])
def test_a_notebook_copied_out_of_the_repository_runs(name, tmp_path):
    """An instructor hands out copies: Run All must work in a folder that is not inside the repository."""
    assert ROOT not in tmp_path.parents
    nb = tmp_path / "handout" / Path(name).name
    nb.parent.mkdir()
    shutil.copy(ROOT / "notebooks" / name, nb)
    out = tmp_path / "executed.ipynb"
    execute_notebook(nb, out, smoke=True, build_dir=tmp_path / "build")
    errors = [o for c in json.loads(out.read_text())["cells"] for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors


@pytest.mark.parametrize("nb", sorted((ROOT / "notebooks" / "exercises").glob("*.ipynb")), ids=lambda p: p.stem)
def test_an_exercise_intro_counts_its_exercises(nb):
    intro = _cells(nb, "markdown")[0]
    stubs = sum(1 for s in _cells(nb, "code") if s.lstrip().startswith("def "))
    said = re.search(r"\b(" + "|".join(NUMBERS) + r") (functions|exercises)\b", intro, re.IGNORECASE)
    if said:
        assert NUMBERS[said.group(1).lower()] == stubs, f"intro says {said.group(0)!r}, the notebook has {stubs}"


def test_a_check_shows_the_students_line_not_the_checkers():
    src = "def pick(xs):\n    first = xs[0]\n    return xs[first + 5]\n"
    ns: dict = {}
    exec(compile(src, "/tmp/ipykernel_4242/1234567.py", "exec"), ns)   # how IPython names a cell's code
    _, error = call(ns["pick"], ([0, 1],))
    assert error.startswith("your function raised IndexError: list index out of range")
    assert "(line 3 of your cell" in error and "exercises" not in error


def test_a_check_names_the_students_line_below_a_library_call():
    import torch
    ns: dict = {}
    exec(compile("import torch\ndef f(x):\n    return torch.cat([x, x[None]])\n", "/tmp/ipykernel_1/2.py", "exec"), ns)
    _, error = call(ns["f"], (torch.zeros(3),))
    assert "RuntimeError" in error and "(line 3 of your cell" in error


DOC_LINK = re.compile(r"\]\((\.\.[^)#\s]*)")


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT / "notebooks")))
def test_relative_links_resolve_inside_the_repository(nb):
    """Started at the repository root (as README says), JupyterLab serves every file a notebook links to."""
    for link in DOC_LINK.findall("\n".join(_cells(nb, "markdown"))):
        target = (nb.parent / link).resolve()
        assert target.exists() and ROOT in target.parents, f"{nb.name}: dead link {link}"


def test_readme_starts_jupyterlab_at_the_repository_root():
    readme = (ROOT / "README.md").read_text()
    starts = re.findall(r"^jupyter lab.*$", readme, re.MULTILINE)
    assert starts and all("notebooks" not in s.split("#")[0] for s in starts), starts


def test_ci_installs_chromium_before_the_test_command():
    """The browser test must run in CI, not be skipped there."""
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    install = next(i for i, l in enumerate(lines) if "apt-get install" in l and "chromium" in l)
    assert "-y" in lines[install] and "DEBIAN_FRONTEND=noninteractive" in lines[install]
    assert install < lines.index("./workbook test")
