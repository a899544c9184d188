"""The main job and its report, on one SMOKE run of every lesson (tests/smoke_build.py): executed notebooks,
figures as PNG, summary.json for `lessonkit compare`, and report.html + summary.md that a person reads."""
import base64
import json
import re
from pathlib import Path

import html5lib
import pytest

from lessonkit.lessons.headline import headline_for, missing_figures, sentence_texts
from lessonkit.report.runner import compare_summaries, lesson_notebooks
from tests.smoke_build import SMOKE_BUDGET, smoke_build  # noqa: F401  (the session fixture)

pytestmark = SMOKE_BUDGET

LESSONS = [p.stem for p in lesson_notebooks()]


@pytest.fixture(scope="module")
def build(smoke_build):  # noqa: F811
    folder, rc = smoke_build
    assert rc == 0, f"the SMOKE main job failed: see {folder / 'notebooks'}"
    return folder


@pytest.fixture(scope="module")
def summary(build):
    return json.loads((build / "summary.json").read_text())


def _html_tree(build):
    """report.html parsed by html5lib in strict mode: any parse error (unclosed or stray tag, bad nesting
    the HTML5 algorithm has to repair) raises."""
    return html5lib.HTMLParser(strict=True, namespaceHTMLElements=False).parse((build / "report.html").read_bytes())


def _notebook_text(executed: Path) -> str:
    nb = json.loads(executed.read_text())
    return "\n".join("".join(o.get("data", {}).get("text/plain", "")) + "".join(o.get("text", ""))
                     for c in nb["cells"] for o in c.get("outputs", []))


def test_every_lesson_ran_and_left_its_notebook_figures_and_figures(build, summary):
    for name in LESSONS:
        assert (build / "notebooks" / f"{name}.ipynb").exists()
        assert (build / "notebooks" / f"{name}.html").exists(), "executed notebook not rendered by nbconvert"
        pngs = list((build / "figures").glob(f"{name}_fig*.png"))
        assert pngs and all(p.read_bytes()[:4] == b"\x89PNG" for p in pngs)
        lesson = summary["lessons"][name]
        assert lesson["status"] == "ok" and lesson["figures"], name
    assert compare_summaries(build / "summary.json", build / "summary.json") == 0


@pytest.mark.parametrize("name", LESSONS)
def test_lesson_executes_records_its_results_and_draws(build, name):
    """What tests/test_notebooks.py checks of an exercise, for a lesson of the main job: no cell failed, the lesson
    called record_results, at least one figure."""
    executed = json.loads((build / "notebooks" / f"{name}.ipynb").read_text(encoding="utf-8"))
    errors = [o for c in executed["cells"] for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, errors[:1]
    assert (build / "results" / f"{name}.json").is_file(), f"{name} did not call record_results"
    assert list((build / "figures").glob(f"{name}_fig*.png")), f"{name} produced no figure"


def test_report_html_is_well_formed(build):
    tree = _html_tree(build)
    assert tree.find(".//title").text == "lessonkit report"
    assert len(tree.findall(".//section")) == len(LESSONS)


def test_every_image_and_link_of_the_report_is_there(build):
    tree = _html_tree(build)
    for img in tree.iter("img"):
        src = img.get("src")
        if src.startswith("data:image/png;base64,"):
            assert base64.b64decode(src.split(",", 1)[1])[:4] == b"\x89PNG"
        else:
            assert (build / src).is_file(), src
    assert len(list(tree.iter("img"))) == len(LESSONS), "one key figure per lesson"
    for a in tree.iter("a"):
        href = a.get("href")
        assert not href.startswith(("http:", "https:", "//")), f"report.html reaches out to {href}"
        assert href.startswith("#") or (build / href).is_file(), href
    md = (build / "summary.md").read_text()
    for link in re.findall(r"\]\(([^)#][^)]*)\)", md):
        assert (build / link).is_file(), link


@pytest.mark.parametrize("name", ["report.html", "summary.md"])
def test_report_has_no_python_reprs_or_raw_keys(build, summary, name):
    text = (build / name).read_text()
    for bad in ("[{", "{'", "<br>", "None", "nan", "True", "False"):
        assert not re.search(rf"(?<![\w]){re.escape(bad)}(?![\w])", text), f"{bad!r} in {name}"
    keys = {k for lesson in summary["lessons"].values() for k in lesson["figures"] if "_" in k or " " in k}
    dumped = sorted(k for k in keys if k in text)
    assert not dumped, f"raw figure names in {name}: {dumped}"


def test_each_lesson_says_its_headline_in_report_notebook_and_summary(build, summary):
    html_items = ["".join(li.itertext()) for li in _html_tree(build).iter("li")]
    md = (build / "summary.md").read_text()
    for name in LESSONS:
        figures = summary["lessons"][name]["figures"]
        h = headline_for(name)
        assert not missing_figures(h, figures), f"{name}: its headline reads figures the notebook did not record"
        said = sentence_texts(h, figures)
        assert 3 <= len(said) <= 6, (name, said)
        assert summary["lessons"][name]["headline"] == said
        notebook = _notebook_text(build / "notebooks" / f"{name}.ipynb")
        for s in said:
            assert s in html_items, (name, s)
            assert f"- {s}" in md, (name, s)
            assert s in notebook, f"{name}: the notebook does not print {s!r}"


def test_each_lesson_has_its_main_table_with_units(build):
    tree = _html_tree(build)
    for name in LESSONS:
        section = tree.find(f".//section[@id='{name}']")
        tables = section.findall(".//table")
        assert len(tables) == 1, f"{name}: no main table"
        headers = ["".join(th.itertext()) for th in tables[0].iter("th")]
        assert any(re.search(r"\(.+\)$", h) for h in headers), f"{name}: no unit in the headers {headers}"
        for td in tables[0].iter("td"):
            cell = "".join(td.itertext())
            assert not re.fullmatch(r"-?\d+\.\d{5,}", cell), f"{name}: {cell} is not rounded"
