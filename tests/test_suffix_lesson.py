"""Lesson 1b's section D (issue 58): the suffix drafter's store curve, one request traced step by step and the
panel over them. The trace adds up to the run it records (every step's tokens, each draft's source and its
accepted part), the curve starts at the empty store and says what it measured from its own numbers, and the
panel answers with figures in units and the steps."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest

from lessonkit.lessons import speculative_more as lesson
from lessonkit.lessons.headline import headline_for
from lessonkit.measure.suffix import sized_store, store_curve, trace_request, trace_summary
from lessonkit.models.registry import load_model
from lessonkit.speculative.suffix import SuffixDrafter
from lessonkit.speculative.verify import speculative_generate

MAX_NEW = 40


@pytest.fixture(scope="module")
def curve():
    """smollm2-135m on records: a store warmed on two training requests, one held-out request, one round."""
    sm = load_model("smollm2-135m")
    df, info = store_curve(sm, n_train=2, n_heldout=1, max_new=MAX_NEW, repeats=1, shares=(0.5, 1.0),
                           families=("records",))
    return sm, df, info


def test_the_curve_starts_empty_grows_and_every_output_is_plain_greedys(curve):
    _, df, info = curve
    assert list(df.store_tokens) == sorted(df.store_tokens) and df.store_tokens.iloc[0] == 0
    assert df.store_tokens.iloc[-1] == info["store"].n_tokens > 0
    assert df.identical_to_plain.all()
    assert ((df.speedup_min <= df.speedup) & (df.speedup <= df.speedup_max)).all()
    assert ((0 <= df.no_draft_share) & (df.no_draft_share <= 1) & (df.tokens_per_verify >= 1)).all()
    assert len(info["requests"]) == len(info["heldout"]) == 1 and info["requests"][0].split == "heldout"


def test_the_plot_says_what_the_run_measured(curve):
    _, df, info = curve
    fig = lesson.plot_store_curve(df, info)
    title = fig._suptitle.get_text()
    assert f"{df.tokens_per_verify.iloc[0]:.2f} -> {df.tokens_per_verify.iloc[-1]:.2f}" in title
    assert f"{df.store_tokens.iloc[-1]:,} tokens" in title and "identical to plain greedy" in title
    for ax in fig.axes:
        assert "(tokens" in ax.get_xlabel() and ax.get_ylabel().endswith(")")
    plt.close(fig)
    words = lesson.suffix_words(df, info)
    assert f"{df.speedup.iloc[-1]:.2f}x" in words and "True" in words
    table = lesson.suffix_table(df)
    assert "tokens per verify" in table.columns and "output == plain greedy" in table.columns


def test_a_traced_request_adds_up_to_its_run(curve):
    sm, _, info = curve
    prompt = info["heldout"][0]
    steps, same = trace_request(sm, info["store"], prompt, MAX_NEW)
    assert same
    out = speculative_generate(sm, SuffixDrafter(info["store"], learn=False), prompt, MAX_NEW, k=8).token_ids
    assert [t for s in steps for t in s["emitted"]] == out[1:]      # the prefill's token comes before the steps
    for i, s in enumerate(steps):
        assert s["source"] in ("request", "store", "none") and 0 <= s["accepted"] <= len(s["drafted"])
        assert s["emitted"][:s["accepted"]] == s["drafted"][:s["accepted"]]
        assert len(s["emitted"]) == s["accepted"] + 1 or i == len(steps) - 1      # the last may stop mid-step
        assert (s["source"] == "none") == (not s["drafted"])
    t = trace_summary(steps)
    assert t["store"]["drafts"] > 0, "a store warmed on records drafts on a held-out record"
    assert t["store"]["drafts"] + t["request"]["drafts"] + round(t["no_draft_share"] * t["steps"]) == t["steps"]
    table = lesson.trace_table(sm, steps)
    assert len(table) == len(steps) and {"source", "accepted drafts", "rejected drafts"} <= set(table.columns)


def test_an_empty_share_is_an_empty_store(curve):
    _, _, info = curve
    assert sized_store(info["store"], 0.0).n_tokens == 0 and len(sized_store(info["store"], 1.0)) == len(info["store"])


def test_the_panel_answers_with_units_and_the_steps(curve, monkeypatch):
    import IPython.display
    sm, _, info = curve
    shown: list = []
    monkeypatch.setattr(IPython.display, "display", shown.append)
    lesson.try_suffix(sm, info)
    html = shown[-1].data
    for label in ("tokens per verify", "steps with no draft", "drafts from the store", "output == plain greedy",
                  "accepted drafts", "% of steps"):
        assert label in html, label
    assert "<td>yes</td>" in html
    empty = lesson.suffix_try_table(sm, info, share=0.0, request=0).data
    assert "drafts from the store</th>\n      <td>0 of 0</td>" in empty


def test_the_headline_says_the_curve(curve):
    _, df, info = curve
    figs = lesson._suffix(df, info)
    assert figs["suffix_store_tokens"] == info["store"].n_tokens and figs["suffix_identical"] is True
    said = " ".join(s.text for s in headline_for("01b_speculative_more").sentences if s.when == "suffix_store_tokens")
    assert "{suffix_tpv_full:.2f}" in said and lesson._suffix(None, None) == {}
