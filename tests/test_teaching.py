"""The instructors' run sheet (issue 59, item 8): docs/teaching.md has, for every lesson, the cells to run live and
pre-executed, its key numbers with their records and one takeaway; lesson 7 is an optional reading of at most ten
main-path cells."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.test_lesson_length import main_path

ROOT = Path(__file__).resolve().parents[1]
LESSONS = sorted((ROOT / "notebooks").glob("*.ipynb"))
SHEET = ROOT / "docs" / "teaching.md"


def _sections() -> dict[str, str]:
    text = SHEET.read_text(encoding="utf-8")
    return {m.group(1): body for m, body in zip(re.finditer(r"^## .*\(`(\d\d[a-z]?_\w+)\.ipynb`\)", text, re.M),
                                              re.split(r"^## .*\(`\d\d[a-z]?_\w+\.ipynb`\)", text, flags=re.M)[1:])}


@pytest.mark.parametrize("nb", LESSONS, ids=lambda p: p.stem)
def test_every_lesson_has_its_run_sheet(nb):
    body = _sections().get(nb.stem)
    assert body is not None, f"docs/teaching.md has no section for {nb.name}"
    for part in ("**Key numbers.**", "**Takeaway:**"):
        assert part in body, f"docs/teaching.md, {nb.name}: no {part}"
    assert "**Live:**" in body or "**Optional reading**" in body, f"docs/teaching.md, {nb.name}: no live cells named"
    assert re.search(r"20\d\d-\d\d-\d\d|export to", body), f"docs/teaching.md, {nb.name}: key numbers without a record"


def test_the_sheet_names_the_minutes():
    text = SHEET.read_text(encoding="utf-8")
    assert "## Minutes" in text and "timings.md" in text


def test_the_coda_is_an_optional_reading_of_ten_cells():
    nb = ROOT / "notebooks" / "07_gap_analysis.ipynb"
    assert len(main_path(nb)) <= 10, f"07_gap_analysis: {len(main_path(nb))} main-path cells"
    assert "optional reading" in "".join(main_path(nb)[0]["source"]).lower()
