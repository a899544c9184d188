"""`lessonkit sweep report` on a break-even sweep (issue 59, item 10): a small real sweep of tiny-moe's measured
cells (run_serial, no Dask, a few seconds), then its page. The measured figures lead, in the point kind's order
(speed-up, tokens per verify, acceptance, bytes read); no parameter, no figure that restates one (budget_frac,
error_rate) and no figure that is the same in every point is drawn; each constant is said once, in the grid
table."""
from __future__ import annotations

import re

import pytest

from lessonkit.cli import main
from lessonkit.sweep import store
from lessonkit.sweep.grid import Sweep
from lessonkit.sweep.points import BREAK_EVEN_PARAMS
from lessonkit.sweep.run import run_serial

LEAD = ["speedup", "tokens_per_forward", "acceptance_rate", "bytes_read_per_token"]


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """Acceptance 0 and 1 at depths 1 and 2, two experts resident, 4 new tokens: the folder, its table, its page."""
    folder = tmp_path_factory.mktemp("be") / "sweep"
    sweep = Sweep("break-even", "tiny-moe", {"acceptance": [0.0, 1.0], "k": [1, 2]},
                  {"budget_experts": 2, "max_new_tokens": 4})
    assert run_serial(sweep, folder)["failed"] == 0
    assert main(["sweep", "report", str(folder)]) == 0
    return folder, store.read_table(folder), (folder / "report.html").read_text(encoding="utf-8")


def _grid_table(html: str) -> str:
    return re.search(r"<table>\s*<caption>The grid</caption>.*?</table>", html, re.S).group(0)


def test_the_measured_figures_lead_in_their_order(swept):
    _, df, html = swept
    drawn = re.findall(r"<figcaption>(.*?)</figcaption>", html)
    assert drawn[:len(LEAD)] == LEAD, drawn
    assert html.count("data:image/png;base64,") == len(drawn)


def test_no_parameter_restated_input_or_constant_is_drawn(swept):
    _, df, html = swept
    drawn = set(re.findall(r"<figcaption>(.*?)</figcaption>", html))
    ok = df[df.status == "ok"]
    constants = {c for c in ok.columns if ok[c].nunique(dropna=False) == 1}
    assert {"budget_frac", "plain_bytes_read_per_token"} <= constants      # what this grid holds fixed
    assert not drawn & (set(BREAK_EVEN_PARAMS) | {"budget_frac", "error_rate"} | constants), drawn


def test_each_constant_is_said_once_in_the_grid_table(swept):
    _, df, html = swept
    grid = _grid_table(html)
    for name, value in (("budget_experts", "2"), ("max_new_tokens", "4"), ("budget_frac", "0.0625"),
                        ("plain_bytes_read_per_token", str(int(df.plain_bytes_read_per_token.iloc[0])))):
        said = f"{name} = {value}"
        assert grid.count(said) == 1 and html.count(name) == 1, (name, html.count(name))
