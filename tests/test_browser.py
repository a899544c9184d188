"""The lessons as a student meets them: JupyterLab in a real browser (the way JupyterLab's own UI tests
work: Galata drives Playwright). A JupyterLab server on a free port, with a token, serves a temporary
copy of notebook 00 in SMOKE mode; headless Chromium opens it, runs all cells, waits for the kernel to
go idle, checks that no cell failed and every widget rendered, moves the budget slider and checks that
the panel's table changes. A screenshot goes to build/test-artifacts/browser/.

Needs Debian's Chromium (`apt-get install chromium`, at /usr/bin/chromium; Playwright's own browser
download is not used) and the `playwright` package (in the dev extras); skipped, saying which is
missing, without them. `.ci/run` installs both."""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")
ARTEFACTS = ROOT / "build" / "test-artifacts" / "browser"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
TOKEN = "lessonkit-browser-test"
# JupyterLab settings for the run: every cell in the page (no windowing), no news or update prompts
LAB_SETTINGS = {"@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
                "@jupyterlab/apputils-extension/notification.jupyterlab-settings":
                    {"fetchNews": "false", "checkForUpdates": False}}

if not CHROMIUM.exists():
    pytest.skip(f"no Chromium at {CHROMIUM} (install it with `apt-get install chromium`; .ci/run does)",
                allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api",
                               reason="playwright is not installed (`pip install -e .[dev]` installs it)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _smoke_copy(dest: Path) -> Path:
    """notebooks/00_engine.ipynb copied to dest/notebooks/ with SMOKE = True in its parameters cell, and
    docs/ beside it: the layout of the repository, served from its root as README says."""
    nb = json.loads((ROOT / "notebooks" / "00_engine.ipynb").read_text())
    params = next(c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", []))
    src = "".join(params["source"])
    assert re.search(r"^SMOKE = False", src, re.MULTILINE), "parameters cell has no `SMOKE = False` to switch"
    params["source"] = re.sub(r"^SMOKE = False", "SMOKE = True", src, flags=re.MULTILINE)
    out = dest / "notebooks" / "00_engine.ipynb"
    out.parent.mkdir(parents=True)
    out.write_text(json.dumps(nb, indent=1))
    shutil.copytree(ROOT / "docs", dest / "docs")         # what its ../docs links open, as in the repository
    return out


def _settings(dest: Path) -> Path:
    for name, value in LAB_SETTINGS.items():
        p = dest / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(value))
    return dest


@contextmanager
def jupyter_lab(tmp_path: Path):
    """A JupyterLab server over a temporary copy of notebook 00: (base URL, notebook path)."""
    root = tmp_path / "lab"
    nb = _smoke_copy(root)
    port = _free_port()
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path / "config"), "IPYTHONDIR": str(tmp_path / "ipython"),
           "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")}
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={root}",
           f"--LabApp.user_settings_dir={_settings(tmp_path / 'settings')}",
           f"--LabApp.workspaces_dir={tmp_path / 'workspaces'}", "--LabApp.extension_manager=readonly",
           *(["--allow-root"] if os.geteuid() == 0 else [])]
    log = (tmp_path / "jupyter.log").open("w")
    server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_for_server(base, server, tmp_path / "jupyter.log")
        yield base, nb
    finally:
        server.terminate()
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


@pytest.fixture
def lab(tmp_path):
    with jupyter_lab(tmp_path) as served:
        yield served


def _wait_for_server(base: str, server, log: Path, timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if server.poll() is not None:
            raise RuntimeError(f"jupyter lab exited ({server.returncode}):\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{base}/api/status?token={TOKEN}", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"jupyter lab did not answer within {timeout:.0f} s:\n{log.read_text()[-3000:]}")


def _run_all_and_wait(page, timeout_s: float = 150) -> None:
    """Run > Run All Cells, then wait until no cell is running or queued and the kernel is idle (all ran,
    or Run All stopped at a failing cell: the saved notebook says which)."""
    page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").wait_for(timeout=60_000)
    page.get_by_text("Python 3 (ipykernel) | Idle").wait_for(timeout=30_000)
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
    prompts = page.locator(".jp-CodeCell .jp-InputArea-prompt")
    page.wait_for_function("() => [...document.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')]"
                           ".some(e => /\\[(\\*|\\d+)\\]/.test(e.innerText))", timeout=20_000)
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        running = [t for t in prompts.all_inner_texts() if "*" in t]
        if not running and page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").count():
            return
        page.wait_for_timeout(500)
    raise AssertionError(f"cells still running after {timeout_s:.0f} s: {prompts.all_inner_texts()}")


def _save_and_read(page, nb: Path, timeout_s: float = 20) -> dict:
    """File > Save (Ctrl+S), then the notebook as saved on disk, once it holds the run's execution counts."""
    page.keyboard.press("Control+s")
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        saved = json.loads(nb.read_text())
        if any(c.get("execution_count") for c in saved["cells"] if c["cell_type"] == "code"):
            return saved
        page.wait_for_timeout(500)
    raise AssertionError(f"the executed notebook was not saved within {timeout_s:.0f} s")


def _errors(saved: dict) -> list[str]:
    """Every error output, and every code cell Run All never reached."""
    out = [f"{o.get('ename')}: {o.get('evalue')}" for c in saved["cells"] for o in c.get("outputs", [])
           if o.get("output_type") == "error"]
    return out + [f"not run: {''.join(c['source'])[:60]!r}" for c in saved["cells"]
                  if c["cell_type"] == "code" and not c.get("execution_count")]


def _open_docs_link(page) -> None:
    """Click the notebook's first link to ../docs/sources.md: JupyterLab opens it (no 404, no error dialog)."""
    page.locator(".jp-RenderedMarkdown a[href*='/files/docs/sources.md']").first.click()
    page.locator(".lm-TabBar-tab", has_text="sources.md").wait_for(timeout=20_000)
    page.locator(".jp-RenderedMarkdown h1").filter(has_text=re.compile("[Ss]ources")).first.wait_for(timeout=20_000)
    assert page.locator(".jp-Dialog").count() == 0, page.locator(".jp-Dialog").all_inner_texts()


def _panel_text(page) -> str:
    return page.locator(".widget-output").last.inner_text()


def test_notebook_00_runs_in_jupyterlab_and_its_slider_responds(lab, tmp_path):
    base, nb = lab
    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 1000})
        try:
            page = browser.new_page()
            page.goto(f"{base}/lab/tree/notebooks/{nb.name}?token={TOKEN}")
            _run_all_and_wait(page)
            page.screenshot(path=str(ARTEFACTS / "00_engine_run_all.png"), full_page=True)
            assert not _errors(_save_and_read(page, nb)), _errors(json.loads(nb.read_text()))
            assert page.get_by_text("Error displaying widget").count() == 0
            slider = page.locator(".widget-hslider").first
            slider.wait_for(timeout=30_000)
            before = _panel_text(page)
            assert "expert budget" in before, before
            slider.locator(".noUi-handle").focus()
            page.keyboard.press("ArrowRight")
            page.wait_for_function("t => { const o = [...document.querySelectorAll('.widget-output')].pop(); "
                                   "return o && o.innerText.includes('expert budget') && o.innerText !== t; }",
                                   arg=before, timeout=60_000)
            after = _panel_text(page)
            page.screenshot(path=str(ARTEFACTS / "00_engine_slider_moved.png"), full_page=True)
            assert page.get_by_text("Error displaying widget").count() == 0
            _open_docs_link(page)
        finally:
            browser.close()
    assert after != before and "expert budget" in after
