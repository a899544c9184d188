"""Each lesson's main path is one class segment (issue 52): the cells up to its summary (the first markdown cell
that starts with "## Summary"), at most 20 cells and about 1,000 words of markdown. Deeper material follows the
summary as appendices, which the main job runs too."""
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LESSONS = sorted((ROOT / "notebooks").glob("*.ipynb"))
MAX_CELLS, MAX_WORDS = 20, 1000


def main_path(nb: Path) -> list[dict]:
    cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
    ends = [i for i, c in enumerate(cells) if c["cell_type"] == "markdown" and "".join(c["source"]).startswith("## Summary")]
    assert ends, f"{nb.name}: no '## Summary' cell ends the main path"
    return cells[: ends[0] + 1]


@pytest.mark.parametrize("nb", LESSONS, ids=lambda p: p.stem)
def test_the_main_path_fits_a_class_segment(nb):
    cells = main_path(nb)
    words = sum(len("".join(c["source"]).split()) for c in cells if c["cell_type"] == "markdown")
    assert len(cells) <= MAX_CELLS and words <= MAX_WORDS, f"{nb.name}: {len(cells)} cells, {words} words to the summary"



def test_the_readme_is_one_a_newcomer_reads():
    """At most about 200 lines (issue 52): timing records live in docs/timings.md, test detail in docs/testing.md."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 210, f"README.md: {len(lines)} lines"
