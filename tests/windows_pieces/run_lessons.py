"""Execute lesson notebooks at SMOKE sizes with the suite's helper (lessonkit.report.runner, as
tests/test_notebooks.py does), recording into OUT/build/results. Usage: run_lessons.py OUT NAME..."""
import sys
import time
from pathlib import Path

from lessonkit.report.runner import execute_notebook

ROOT = Path(__file__).resolve().parents[2]

if __name__ == "__main__":
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for name in sys.argv[2:]:
        nb = ROOT / "notebooks" / f"{name}.ipynb"
        t0 = time.perf_counter()
        execute_notebook(nb, out / nb.name, smoke=True, build_dir=out / "build")
        print(f"{name} {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
