"""A lesson's headline: its results as sentences with units, its main table and its key figure.

Each lesson module declares one `HEADLINE` from the figures its notebook records. The notebook's last
cell (`record_results`) and the main job's report (`lessonkit/report/html.py`) both render it from the same recorded
numbers, so the notebook and `build/report.html` say the same thing.

Templates are `str.format` strings whose fields are figure names, looked up whole (names may hold dots
and spaces): "{restore_s:.3f} s". A bool's format spec "A|B" says A when true and B when false; a
missing or non-finite figure reads "n/a".
"""
from __future__ import annotations

import importlib
import math
import re
import string
from dataclasses import dataclass

# lesson (notebook stem) -> the module that declares its HEADLINE
LESSON_MODULES = {
    "00_engine": "lessonkit.lessons.engine",
    "01_speculative": "lessonkit.lessons.speculative",
    "01b_speculative_more": "lessonkit.lessons.speculative_more",
    "02_mtp": "lessonkit.lessons.mtp",
    "03_grammar": "lessonkit.lessons.grammar",
    "04_prefix_cache": "lessonkit.lessons.prefix_cache",
    "05_semantic_cache": "lessonkit.lessons.semantic_cache",
    "06_stack": "lessonkit.lessons.stack",
    "07_gap_analysis": "lessonkit.lessons.gap_analysis",
}


@dataclass(frozen=True)
class Sentence:
    """One headline sentence. each: a figure-name pattern with one "*" ("*_all_speedup"); the sentence is
    said once per matching figure, "*" inside the template's field names stands for the matched part and
    the field {*} names it (underscores read as hyphens: "smollm2_135m" -> "smollm2-135m").
    when: a figure name; the sentence is said only when this run recorded it (not None)."""
    text: str
    each: str | None = None
    when: str | None = None


@dataclass(frozen=True)
class Column:
    """A column of the main table: the recorded name, its header with the unit, its format spec and a
    factor applied before formatting (bytes to MiB: 2**-20)."""
    name: str
    header: str
    fmt: str = ""
    scale: float = 1.0

    def cell(self, record: dict) -> str:
        v = record.get(self.name)
        if self.scale != 1.0 and isinstance(v, (int, float)) and not isinstance(v, bool):
            v = v * self.scale
        return format_value(v, self.fmt, missing="\u2013")


@dataclass(frozen=True)
class Headline:
    """title: the lesson in a few words. table: where the main table's rows come from, "table" (the
    DataFrame passed to record_results) or the name of a figure that holds a list of records.
    figure: the key figure is the first one drawn by the first code cell whose source contains this text."""
    title: str
    sentences: tuple[Sentence, ...]
    columns: tuple[Column, ...] = ()
    table: str = "table"
    caption: str = ""
    figure: str | None = None


def headline_for(lesson: str) -> Headline | None:
    """The HEADLINE its lesson module declares, or None for a notebook outside LESSON_MODULES."""
    module = LESSON_MODULES.get(lesson)
    return importlib.import_module(module).HEADLINE if module else None


def format_value(value, spec: str = "", missing: str = "n/a") -> str:
    """A figure as the report writes it: "A|B" specs for bools, numbers by spec (3 significant digits by
    default), lists joined by commas, None and non-finite numbers as `missing`."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return missing
    if "|" in spec or isinstance(value, bool):
        yes, _, no = (spec if "|" in spec else "yes|no").partition("|")
        return yes if value else no
    if isinstance(value, (int, float)):
        return format(value, spec) if spec else (f"{value:.3g}" if isinstance(value, float) else str(value))
    if isinstance(value, (list, tuple)):
        return ", ".join(format_value(v) for v in value)
    try:
        return format(str(value), spec)
    except ValueError:      # a numeric spec on a text figure
        return str(value)


class _FigureFormatter(string.Formatter):
    def get_field(self, field_name, args, kwargs):
        return kwargs.get(field_name), field_name

    def format_field(self, value, format_spec):
        return format_value(value, format_spec)


_FORMATTER = _FigureFormatter()


def fields(text: str) -> list[str]:
    """The figure names a template reads."""
    return [f for _, f, _, _ in _FORMATTER.parse(text) if f is not None]


def _bind(text: str, part: str) -> str:
    """The template with "*" in its field names replaced by part ({*} itself is left to name it)."""
    return re.sub(r"\{([^{}:!]+)", lambda m: "{" + (m.group(1) if m.group(1) == "*"
                                                   else m.group(1).replace("*", part)), text)


def matches(pattern: str, figures: dict) -> list[str]:
    """The parts of figure names that "*" stands for in pattern, in recording order."""
    rx = re.compile(re.escape(pattern).replace(r"\*", "(.+)") + "$")
    return [m.group(1) for k in figures if (m := rx.match(k))]


def sentence_texts(headline: Headline | None, figures: dict) -> list[str]:
    """Every headline sentence of a lesson, built from this run's figures."""
    out = []
    for s in headline.sentences if headline else ():
        if s.when is not None and figures.get(s.when) is None:
            continue
        for part in matches(s.each, figures) if s.each else [None]:
            text = s.text if part is None else _bind(s.text, part)
            values = figures if part is None else {**figures, "*": part.replace("_", "-")}
            out.append(_FORMATTER.vformat(text, (), values))
    return out


def missing_figures(headline: Headline, figures: dict) -> list[str]:
    """Figures a sentence reads that this run did not record (a renamed figure reads "n/a" otherwise)."""
    missing = []
    for s in headline.sentences:
        for part in matches(s.each, figures) if s.each else [None]:
            text = s.text if part is None else _bind(s.text, part)
            missing += [f for f in fields(text) if f != "*" and f not in figures]
    return missing


def main_table(headline: Headline | None, figures: dict, table: list | None) -> tuple[list[str], list[list[str]]]:
    """The main table as headers and rows of formatted cells (empty when the run recorded none)."""
    if headline is None:
        return [], []
    records = table if headline.table == "table" else figures.get(headline.table)
    if not records:
        return [], []
    cols = headline.columns or tuple(Column(k, k) for k in records[0])
    return [c.header for c in cols], [[c.cell(r) for c in cols] for r in records]
