"""docs/architecture.md draws the ladder from the code: its generated part is what tests/render_architecture.py
renders from today's imports, so the picture cannot go stale."""
from __future__ import annotations

from render_architecture import DOC, REGENERATE, _graph, arrows, generated_part, render, stale


def test_the_architecture_doc_is_rendered_from_the_code():
    problem = stale(DOC.read_text(encoding="utf-8"))
    assert problem is None, problem


def test_a_new_arrow_makes_the_doc_stale():
    """One more import between rooms (report -> gap, which no report module imports today) renders another
    picture, and the check says how to regenerate; a doc without its markers is caught too."""
    graph = _graph()
    runner = next(m for m in graph if m.startswith("lessonkit.report."))
    gap = next(m for m in graph if m.startswith("lessonkit.gap."))
    assert ("report", "gap") not in arrows(graph)
    graph[runner] = graph[runner] | {gap}
    assert arrows(graph)[("report", "gap")] == 1
    text = DOC.read_text(encoding="utf-8")
    problem = stale(text, render(graph))
    assert problem is not None and REGENERATE in problem
    assert "r_report -->|1| r_gap" in render(graph) and "r_report -->|1| r_gap" not in generated_part(text)
    assert stale(text.replace("<!-- end generated -->", "")) is not None
