"""The lessons as a student meets them (issue 36): notebooks that run wherever they are opened, checks
that point at the student's own line, exercise intros that count their exercises, links that resolve."""
import json
import os
import re
import shutil
from pathlib import Path

import pytest

import lessonkit
import lessonkit.files.resources
from lessonkit.errors import LessonkitError
from lessonkit.exercises import call
from lessonkit.report.runner import execute_notebook

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
    monkeypatch.setattr(lessonkit.files.resources, "workbook_root", lambda: tmp_path)
    with pytest.raises(LessonkitError, match="reinstall the wheel"):
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


def _cell_file(folder: str, name: str) -> str:
    """A file name as IPython gives a cell's code (under the temporary directory)."""
    import tempfile
    return os.path.join(tempfile.gettempdir(), folder, name)


def test_a_check_shows_the_students_line_not_the_checkers():
    src = "def pick(xs):\n    first = xs[0]\n    return xs[first + 5]\n"
    ns: dict = {}
    exec(compile(src, _cell_file("ipykernel_4242", "1234567.py"), "exec"), ns)   # how IPython names a cell's code
    _, error = call(ns["pick"], ([0, 1],))
    assert error.startswith("your function raised IndexError: list index out of range")
    assert "(line 3 of your cell" in error and "exercises" not in error


def test_a_check_names_the_students_line_below_a_library_call():
    import torch
    ns: dict = {}
    exec(compile("import torch\ndef f(x):\n    return torch.cat([x, x[None]])\n", _cell_file("ipykernel_1", "2.py"), "exec"), ns)
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
    lines = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    install = next(i for i, l in enumerate(lines) if "apt-get install" in l)
    asks = [i for i, l in enumerate(lines[:install + 1]) if "chromium" in l and not l.lstrip().startswith("#")]
    assert asks, "chromium is not among the packages .ci/run installs"
    assert "-y" in lines[install] and "DEBIAN_FRONTEND=noninteractive" in lines[install]
    assert install < next(i for i, l in enumerate(lines) if l.startswith("./workbook test"))


# ---- lesson figures and panels ---------------------------------------------------------------------
def _drafter_rows(n: int = 5):
    import pandas as pd
    return pd.DataFrame([{"model": "tiny-moe", "drafter": f"d{i}", "k": 4, "acceptance_rate": 0.5, "a1": 0.7,
                          "a2": 0.6, "a3": 0.5, "a4": 0.4, "c": 0.1, "measured_speedup": 1.2,
                          "breakdown_speedup": 1.1, "identical_to_plain": True} for i in range(n)])


def _whole(ticks) -> bool:
    return all(float(t).is_integer() for t in ticks)


def test_counting_axes_have_whole_ticks_and_long_legends_sit_beside_the_data():
    import matplotlib.pyplot as plt
    from lessonkit.lessons.speculative import plot_drafter_comparison
    fig = plot_drafter_comparison(_drafter_rows())
    ax1 = fig.axes[0]
    lo, hi = ax1.get_xlim()
    assert _whole(t for t in ax1.get_xticks() if lo <= t <= hi)
    fig.canvas.draw()
    legend = ax1.get_legend().get_window_extent()
    assert not legend.overlaps(ax1.get_window_extent()), "a five-entry legend covers the plot"
    plt.close(fig)


def test_routing_heat_ticks_sit_on_experts_and_layers():
    import matplotlib.pyplot as plt
    from lessonkit.models.registry import load_model
    from lessonkit.lessons.engine import routing_heat
    _, fig = routing_heat(load_model("tiny-moe"), ["def f(x):\n    return x\n"])
    ax = fig.axes[0]
    for ticks, (lo, hi) in ((ax.get_xticks(), ax.get_xlim()), (ax.get_yticks(), sorted(ax.get_ylim()))):
        shown = [t for t in ticks if lo <= t <= hi]
        assert shown and _whole(shown), shown
    plt.close("all")


def test_compare_drafters_leaves_exactly_one_open_figure():
    import matplotlib.pyplot as plt
    from lessonkit.lessons.speculative import compare_drafters
    plt.close("all")
    _, fig, _ = compare_drafters(("tiny-moe",), k=2, n_prompts=1, max_new_tokens=4, repeats=1, only=("n-gram lookup",))
    assert plt.get_fignums() == [fig.number]
    plt.close("all")


def test_lesson_1_panel_gives_a_table_with_units():
    from lessonkit.lessons.speculative import PANEL_BUDGETS, try_it_table
    from lessonkit.measure.speculative import lesson_models
    from lessonkit.workloads.corpus import prompts_by_kind
    target, draft, _ = lesson_models("tiny-moe", "tiny-draft")
    prompt = prompts_by_kind(target, n=1, max_tokens=24, seed=0)["code"][0]
    assert all(isinstance(label, str) and label for label in PANEL_BUDGETS)   # a dropdown shows its labels
    table = try_it_table(target, draft, prompt, k=2, drafter="tiny-draft", budget="2 experts", n_new=6)
    assert list(table.columns) == ["value", "unit"] and table.loc["identical to plain", "value"] == "yes"
    assert table.loc["speculative speed", "unit"] == "tokens / s"
    for v in table["value"]:
        assert not re.search(r"\d\.\d{3,}", v), f"unformatted number {v!r}"


def test_a_panel_shows_full_labels_and_recomputes_when_a_control_moves(monkeypatch):
    import ipywidgets as w
    import IPython.display
    from lessonkit.lessons import panel
    shown, calls = [], []
    monkeypatch.setattr(IPython.display, "display", shown.append)
    slider = w.IntSlider(value=1, min=0, max=5, description="temperature and more")
    panel.show_panel({"n": slider}, lambda n: calls.append(n) or f"table for {n}")
    assert calls == [1] and isinstance(shown[0], w.VBox)
    assert slider.style.description_width == "initial" and slider.continuous_update is False
    slider.value = 3
    assert calls == [1, 3] and shown[-1] == "table for 3"


def test_a_schema_valid_answer_is_reported_valid_though_the_model_stopped_on_its_end_token():
    from lessonkit.engine.generate import GenerationResult
    from lessonkit.models.registry import load_model
    from lessonkit.lessons.grammar import schema_answer
    eng = load_model("tiny-moe")
    person = {"type": "object", "required": ["name", "age", "city"],
              "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "city": {"type": "string"}}}
    ids = eng.encode('{"name": "John Smith", "age": 45, "city": "New York"}') + [eng.config.eos_ids[0]]
    result = GenerationResult(ids, eng.decode(ids))
    assert result.text.endswith(eng.decode([eng.config.eos_ids[0]]))       # what json.loads used to fail on
    assert schema_answer(eng, result, person) == ('{"name": "John Smith", "age": 45, "city": "New York"}', True)
    bad = eng.encode('{"name": "John Smith", "age": "old"}')
    assert schema_answer(eng, GenerationResult(bad, eng.decode(bad)), person)[1] is False


def test_lesson_3_panel_gives_forced_bytes_and_the_drafting_ceiling():
    from lessonkit.models.registry import load_model
    from lessonkit.lessons.grammar import forcing_table
    from lessonkit.measure.grammar import corpus_records
    eng, records = load_model("tiny-moe"), corpus_records(12)
    compact = forcing_table(eng, records)
    sloppy = forcing_table(eng, records, writing="sloppy")
    assert list(compact.columns) == ["value", "unit"]
    forced = [float(t.loc["bytes forced by the grammar", "value"]) for t in (compact, sloppy)]
    assert forced[0] > forced[1] > 0, forced          # whitespace freedom takes forced bytes away



@pytest.fixture
def shown(monkeypatch):
    """What a panel displays, headless: [the widget box, the first table or figure]."""
    import IPython.display
    out: list = []
    monkeypatch.setattr(IPython.display, "display", out.append)
    return out


def test_lesson_2_panel_shows_acceptance_per_position_and_kind(shown):
    import pandas as pd
    from lessonkit.models.registry import load_model
    from lessonkit.lessons.mtp import quant_panel
    from lessonkit.mtp.evaluate import eval_windows
    from lessonkit.mtp.head import Shared, load_head
    eng = load_model("tiny-moe")
    quant_panel({"tiny-moe": load_head(eng)}, {"tiny-moe": Shared.from_engine(eng)},
                {"tiny-moe": eval_windows(eng, 1, 32, spread=True)})
    table = shown[-1]
    assert isinstance(table, pd.DataFrame) and list(table.index) == ["position 1 (% accepted)", "position 2 (% accepted)"]


def test_lesson_4_and_7_panels_show_a_table_and_one_figure(shown):
    import matplotlib.pyplot as plt
    import pandas as pd
    from lessonkit.lessons.prefix_cache import restore_panel
    from lessonkit.lessons.stack import ablation_panel
    restore_panel(pd.DataFrame([{"prefix tokens": n, "prefill s": 0.01 * n, "restore s": 0.001 * n,
                                 "restore / prefill": 0.1, "bytes on disk": 1000 * n} for n in (64, 128)]))
    assert shown[-1].loc["restore / prefill", "value"] == "10.0" and shown[-1].loc["prefill", "unit"] == "ms"
    plt.close("all")
    ablation_panel(pd.DataFrame([{"model": m, "row": r, "speedup": 1.5, "identical_to_plain": True}
                                 for m in ("tiny-moe", "smollm2-135m") for r in ("plain", "all together")]))
    assert hasattr(shown[-1], "savefig") and plt.get_fignums() == [], "the panel's figure stays open: shown twice"


def test_lesson_5_panel_shows_hits_losses_and_the_audit(shown):
    from lessonkit.lessons.semantic_cache import LessonData, policy_panel
    policy_panel(LessonData(smoke=True, live=False))
    table = shown[-1]
    assert {"hits", "losses", "audits", "audit upper bound", "stopped serving at"} <= set(table.index)
    assert table.loc["audit upper bound", "unit"] == "% loss rate (95%)"

@pytest.mark.parametrize("nb", sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb")), ids=lambda p: p.stem)
def test_every_lesson_has_a_panel_and_its_logic_lives_in_lessonkit(nb):
    """README: every notebook has controls; a panel is one call into lessonkit/lessons/, not code in a cell."""
    panels = [s for s in _cells(nb, "code") if s.startswith("if INTERACTIVE")]
    assert len(panels) == 1, "no `if INTERACTIVE:` panel cell"
    body = [l for l in panels[0].splitlines()[1:] if l.strip() and not l.strip().startswith("#")]
    assert len(body) <= 2 and "import" not in panels[0] and "lesson" in panels[0], panels[0]


def _audited(policy, trajectory, stopped_at=None):
    from types import SimpleNamespace as NS
    return NS(policy=policy, auditor=NS(trajectory=trajectory, stopped_at=stopped_at), audit=NS(limit=0.1))


def test_an_audit_plot_shows_what_its_title_claims():
    import matplotlib.pyplot as plt
    from lessonkit.lessons.semantic_cache import plot_audit
    stopped = plot_audit(_audited("two-sided", [(7, 1, 1, 0.95)], stopped_at=7))   # stopped after one audit
    ax = stopped.axes[0]
    title = ax.get_title()
    assert "1 loss in 1 audit" in title and "stopped serving at query 7" in title and "Zero losses" not in title
    own = [l for l in ax.get_lines() if "its audits" in l.get_label()]
    assert own and own[0].get_marker() not in (None, "None", "")          # one audit is a visible point
    assert ax.get_xlim()[1] >= 50                                          # the references are not cut to 1..2
    cp, three = (next(l for l in ax.get_lines() if key in l.get_label()) for key in ("Clopper", "rule of three"))
    assert cp.get_linewidth() > three.get_linewidth(), "the Clopper-Pearson line hides under the 3/n line"
    clean = plot_audit(_audited("one-sided+guard", [(i, i, 0, 3.0 / i) for i in range(1, 40)]))
    assert "0 losses in 39 audits" in clean.axes[0].get_title()
    none = plot_audit(_audited("one-sided", []))
    assert "no audits" in none.axes[0].get_title() and none.axes[0].texts
    plt.close("all")
