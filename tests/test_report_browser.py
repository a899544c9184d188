"""build/report.html as a reader opens it: headless Chromium (Debian's, driven by Playwright) loads the SMOKE
main job's report (tests/smoke_build.py) from disk with every network request refused, checks that each
lesson's section, main table and key figure rendered (images decoded, no script or console error, no
request leaving the page) and saves a full-page screenshot to build/test-artifacts/report/report.png.

Needs Debian's Chromium (`apt-get install chromium`, at /usr/bin/chromium) and the `playwright` package;
skipped, saying which is missing, without them."""
from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from lessonkit.report.runner import lesson_notebooks
from tests.smoke_build import SMOKE_BUDGET, smoke_build  # noqa: F401  (the session fixture)

pytestmark = SMOKE_BUDGET

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")
ARTEFACTS = ROOT / "build" / "test-artifacts" / "report"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]

if not CHROMIUM.exists():
    pytest.skip(f"no Chromium at {CHROMIUM} (install it with `apt-get install chromium`)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api",
                               reason="playwright is not installed (`pip install -e .[dev]` installs it)")

BROKEN_IMAGES = "Array.from(document.images).filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.alt)"


@contextlib.contextmanager
def offline_page(outside: list[str], errors: list[str]):
    """A Chromium page that refuses the network (noting each request in outside) and notes every console or
    page error in errors."""
    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            _offline(page, outside)
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            yield page
        finally:
            browser.close()


def _offline(page, outside: list[str]) -> None:
    """Refuse every request that is not a local file, noting it."""
    def handle(route):
        if route.request.url.startswith(("file:", "data:")):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()
    page.route("**/*", handle)


def test_report_renders_offline_in_chromium(smoke_build):  # noqa: F811
    build, rc = smoke_build
    assert rc == 0, "the SMOKE main job failed"
    n = len(lesson_notebooks())
    outside, errors = [], []
    with offline_page(outside, errors) as page:
        page.goto((build / "report.html").as_uri(), wait_until="load")
        assert page.title() == "lessonkit report"
        assert page.locator("section").count() == n
        assert page.locator("section table").count() == n, "a lesson's main table is missing"
        assert page.locator("section ul.headline li").count() >= 3 * n
        assert page.locator("section img").count() == n
        assert page.evaluate(BROKEN_IMAGES) == [], "an image did not decode"
        page.screenshot(path=str(ARTEFACTS / "report.png"), full_page=True)
    assert not outside, f"the report reached out: {outside}"
    assert not errors, errors
    assert (ARTEFACTS / "report.png").read_bytes()[:4] == b"\x89PNG"


def test_a_notebook_page_renders_its_formulas_offline(tmp_path):
    """Lesson 1's page as `lessonkit run` renders it (tests/test_report.py renders it without a browser), opened
    in Chromium with every network request refused: nothing is requested, no script fails, and its formulas are
    drawn (each an SVG with a size on the page, the break-even inequality among them). Screenshot of the
    formula section: build/test-artifacts/report/formulas.png."""
    import shutil

    from lessonkit.report.html import render_notebooks
    (tmp_path / "notebooks").mkdir()
    shutil.copy(ROOT / "notebooks" / "01_speculative.ipynb", tmp_path / "notebooks")
    html = tmp_path / render_notebooks(tmp_path, ["01_speculative"])["01_speculative"]
    outside, errors = [], []
    with offline_page(outside, errors) as page:
        page.goto(html.as_uri(), wait_until="load")
        sizes = page.evaluate("Array.from(document.querySelectorAll('.math svg')).map(s => {"
                              "const r = s.getBoundingClientRect(); return [r.width, r.height]; })")
        assert len(sizes) >= 4 and all(w > 5 and h > 5 for w, h in sizes), sizes
        formula = page.locator('.math[aria-label^="E(k) > "]')
        assert formula.count() == 1, "the break-even inequality is not rendered"
        formula.scroll_into_view_if_needed()
        page.screenshot(path=str(ARTEFACTS / "formulas.png"))
        assert "$$" not in page.inner_text("body")
    assert not outside, f"the notebook page reached out: {outside}"
    assert not errors, errors
