"""Helpers shared by tests/test_exercises_*.py: run a check and capture the line it prints, and load
the functions a lesson's notebook defines (its solution or its exercise stubs)."""
import io
import json
from contextlib import redirect_stdout
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(check_fn, fn):
    """check_fn(fn) with its stdout captured: (what it returned, what it printed)."""
    buf = io.StringIO()
    with redirect_stdout(buf):
        ok = check_fn(fn)
    return ok, buf.getvalue()


def notebook_functions(notebook: str, sub: str = "solutions") -> dict:
    """The namespace of notebooks/<sub>/<notebook>.ipynb after its setup and `def` cells: every code
    cell that defines or imports something, except the cells that run a check (`check.`) and the Colab
    install cell."""
    nb = json.loads((ROOT / "notebooks" / sub / f"{notebook}.ipynb").read_text())
    ns: dict = {}
    for cell in nb["cells"]:
        src = "".join(cell["source"])
        if "colab-setup" in cell.get("metadata", {}).get("tags", []):     # IPython magics, and Colab only
            continue
        if cell["cell_type"] == "code" and (src.startswith("def ") or "import" in src) and "check." not in src:
            exec(compile(src, f"{notebook}.ipynb", "exec"), ns)
    return ns


def solution_functions(notebook: str) -> dict:
    """The functions of the solution notebook, e.g. solution_functions("07_gap")["running_max"]."""
    return notebook_functions(notebook, "solutions")


def exercise_functions(notebook: str) -> dict:
    """The stubs of the exercise notebook (each raises NotImplementedError)."""
    return notebook_functions(notebook, "exercises")
