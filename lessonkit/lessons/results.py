"""Headline figures of each lesson: recorded by the notebook's last cell, gathered by `lessonkit run`.

The last cell shows the lesson's headline sentences (lessonkit.lessons.headline), built from the same
figures the main job's report reads, so the notebook and build/report.html say the same thing."""
from __future__ import annotations

import json
import math
from pathlib import Path

from lessonkit.lessons.headline import headline_for, sentence_texts


def _plain(v):
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


def table_records(table) -> list[dict] | None:
    """A lesson's main table as a list of plain records (a DataFrame's named index becomes columns)."""
    if table is None:
        return None
    if hasattr(table, "to_dict"):
        if any(n is not None for n in table.index.names):
            table = table.reset_index()
        table = table.to_dict("records")
    return [{str(k): _plain(v) for k, v in row.items()} for row in table]


class HeadlineSentences:
    """What the notebook's last cell shows: the lesson's headline sentences, as a list."""

    def __init__(self, lesson: str, sentences: list[str]):
        self.lesson, self.sentences = lesson, sentences

    def __repr__(self) -> str:
        return "\n".join(f"- {s}" for s in self.sentences) or f"(no headline declared for {self.lesson})"

    def _repr_markdown_(self) -> str:
        return "**Headline results of this run**\n\n" + repr(self)


def record_results(lesson: str, figures: dict, table=None, *, build_dir: str | Path | None = None) -> HeadlineSentences:
    """Write figures (and the lesson's main table) to build_dir/results/<lesson>.json when given (the
    notebook's BUILD_DIR parameter, set by `lessonkit run`), and return the headline sentences they make."""
    clean = {k: _plain(v) for k, v in figures.items()}
    build = build_dir
    if build:
        out = Path(build) / "results"
        out.mkdir(parents=True, exist_ok=True)
        record = {"lesson": lesson, "figures": clean, "table": table_records(table)}
        (out / f"{lesson}.json").write_text(json.dumps(record, indent=2, default=str), encoding="utf-8")
    return HeadlineSentences(lesson, sentence_texts(headline_for(lesson), clean))
