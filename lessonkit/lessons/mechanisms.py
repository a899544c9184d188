"""One figure of the mechanism per lesson (issue 59, item 1): what happens, drawn, before any number is measured.
Each function returns a matplotlib Figure whose title states the mechanism; the data-driven ones (the verify step,
the forced spans) draw what the run passes them, the others are schematics of the workbook's own pipeline.

  draft_and_verify   lesson 1: one verify step's rows, accepted, rejected, discarded, the bonus token
  mtp_head           lesson 2: the head reads the target's last hidden state and the next token's embedding
  forced_spans       lesson 3: a record's bytes, the grammar's forced spans marked
  prefix_snapshot    lesson 4: the shared prefix's KV saved once, restored, only the item prefilled
  one_sided_cache    lesson 5: which cached answers a one-sided policy with its guard may serve
  the_stack          lesson 6: an item through the semantic cache, the prefix cache and speculative decoding
"""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

COLOURS = {"accepted": "#8fd18f", "rejected": "#f29c9c", "discarded": "#dddddd", "bonus": "#8fb8f2",
           "target": "#f7f2c4", "new": "#c9e4f7", "disk": "#e6d5f2", "plain": "#ffffff"}


def _box(ax, x, y, w, h, text, colour="plain", fontsize=8, **kw):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02", facecolor=COLOURS.get(colour, colour),
                                edgecolor="#555555", lw=0.8))
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize, **kw)


def _arrow(ax, xy0, xy1, text="", fontsize=7):
    ax.add_patch(FancyArrowPatch(xy0, xy1, arrowstyle="-|>", mutation_scale=10, lw=0.9, color="#444444"))
    if text:
        ax.text((xy0[0] + xy1[0]) / 2, (xy0[1] + xy1[1]) / 2 + 0.04, text, ha="center", va="bottom", fontsize=fontsize)


def _canvas(w=10, h=3.2, xlim=(0, 10), ylim=(0, 3)):
    fig, ax = plt.subplots(figsize=(w, h))
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    ax.axis("off")
    return fig, ax


def _verdict_colour(verdict: str) -> str:
    return ("accepted" if verdict == "accepted" else "discarded" if verdict == "discarded"
            else "bonus" if verdict.startswith("bonus") else "rejected")


def draft_and_verify(trace, title: str | None = None):
    """Lesson 1: one verify step from `measure.speculative.trace_verify_step`'s table (columns drafted, target
    picks, verdict, emitted; one row per verify row). Top: the drafts, coloured by verdict; bottom: the target's
    pick at each row, the bonus token marked; the emitted tokens are the accepted drafts plus that bonus."""
    n = len(trace)
    fig, ax = _canvas(w=max(6.0, 1.5 * n + 2), h=3.0, xlim=(-1.6, n + 0.2), ylim=(-0.4, 2.6))
    ax.text(-1.5, 1.75, "drafter\nproposes", fontsize=8, va="center")
    ax.text(-1.5, 0.45, "target's pick\n(one forward)", fontsize=8, va="center")
    bonus_row = None
    for i, r in enumerate(trace.itertuples(index=False)):
        verdict = r.verdict
        if r.drafted:
            _box(ax, i, 1.5, 0.9, 0.5, r.drafted, _verdict_colour(verdict))
        is_bonus = verdict.startswith("rejected") or verdict.startswith("bonus")
        bonus_row = i if is_bonus else bonus_row
        _box(ax, i, 0.2, 0.9, 0.5, getattr(r, "_1"), "bonus" if is_bonus else "target")
        if r.drafted and verdict != "discarded":
            _arrow(ax, (i + 0.45, 0.72), (i + 0.45, 1.48), "=" if verdict == "accepted" else "!=")
    accepted = int((trace["verdict"] == "accepted").sum())
    handles = [plt.Rectangle((0, 0), 1, 1, facecolor=COLOURS[k], edgecolor="#555555") for k in
               ("accepted", "rejected", "discarded", "bonus")]
    ax.legend(handles, ["accepted draft", "rejected draft", "discarded (after a rejection)", "the target's bonus token"],
              loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=4, fontsize=7, frameon=False)
    ax.set_title(title or f"One verify forward: {accepted} draft{'' if accepted == 1 else 's'} accepted, then the target's own token at row "
                 f"{bonus_row}: {accepted + 1} tokens for one forward", fontsize=9)
    fig.tight_layout()
    return fig


def mtp_head():
    """Lesson 2: the MTP head drafts token t+2 from the target's last hidden state at t and the embedding of the
    token t+1 the target just picked (normalised, concatenated, mixed by eh_proj, one block, the shared output)."""
    fig, ax = _canvas(w=10, h=3.2, xlim=(0, 10.2), ylim=(0, 3))
    _box(ax, 0.1, 2.0, 1.8, 0.7, "target's layers\n(one forward)", "target")
    _box(ax, 2.4, 2.0, 1.6, 0.7, "hidden state h_t\n(last layer)", "target")
    _box(ax, 0.1, 0.5, 1.8, 0.7, "token t+1\n(the target's pick)", "target")
    _box(ax, 2.4, 0.5, 1.6, 0.7, "embedding\n(shared)", "target")
    _box(ax, 4.5, 1.2, 1.6, 0.8, "[norm(h_t);\nnorm(emb)]", "new")
    _box(ax, 6.5, 1.2, 1.2, 0.8, "eh_proj\n(2d -> d)", "new")
    _box(ax, 8.0, 1.2, 1.0, 0.8, "one\nblock", "new")
    _box(ax, 9.2, 1.2, 0.9, 0.8, "output\nlayer", "target")
    for a, b in (((1.9, 2.35), (2.4, 2.35)), ((1.9, 0.85), (2.4, 0.85)), ((4.0, 2.35), (4.5, 1.8)),
                 ((4.0, 0.85), (4.5, 1.4)), ((6.1, 1.6), (6.5, 1.6)), ((7.7, 1.6), (8.0, 1.6)), ((9.0, 1.6), (9.2, 1.6))):
        _arrow(ax, a, b)
    ax.text(9.65, 0.9, "draft t+2", ha="center", fontsize=8)
    ax.text(5.3, 0.55, "eh_proj's two column halves differ in scale:\nper-row int4 can round the embedding half to zero",
            ha="center", fontsize=7, style="italic")
    ax.set_title("The MTP head reuses the target's hidden state: yellow is the target's, blue is the head's own",
                 fontsize=9)
    fig.tight_layout()
    return fig


def forced_spans(marked: str, width: int = 64, title: str | None = None):
    """Lesson 3: a record with its forced bytes in [brackets] (`lessons.grammar.forced_spans`), drawn byte by byte:
    green where the grammar knew the byte in advance (a free draft), white where the model chose it."""
    cells, forced = [], False
    for ch in marked:
        if ch == "[":
            forced = True
        elif ch == "]":
            forced = False
        else:
            cells.append((ch, forced))
    rows = max(1, -(-len(cells) // width))
    fig, ax = _canvas(w=10, h=0.35 * rows + 0.9, xlim=(0, width), ylim=(-rows, 0.2))
    for i, (ch, f) in enumerate(cells):
        x, y = i % width, -(i // width) - 1
        ax.add_patch(plt.Rectangle((x, y), 1, 1, facecolor=COLOURS["accepted"] if f else "white", edgecolor="#bbbbbb",
                                   lw=0.3))
        ax.text(x + 0.5, y + 0.5, ch if ch.isprintable() and ch != " " else "\u00b7", ha="center", va="center",
                fontsize=6, family="monospace")
    share = sum(f for _, f in cells) / max(len(cells), 1)
    ax.set_title(title or f"The grammar forces {share:.0%} of this record's bytes (green): free, always-accepted drafts",
                 fontsize=9)
    fig.tight_layout()
    return fig


def prefix_snapshot(prefix_tokens: int = 552, item_tokens: int = 40):
    """Lesson 4: the first request prefills the shared prefix and saves its KV to disk under a key of the model,
    the tokenizer and the prefix's tokens; every later request (a restart included) restores it and prefills only its item."""
    fig, ax = _canvas(w=10, h=3.2, xlim=(0, 10), ylim=(0, 3))
    total = prefix_tokens + item_tokens
    pw = 6.0 * prefix_tokens / total
    _box(ax, 0.3, 2.1, pw, 0.55, f"shared prefix: {prefix_tokens} tokens (system prompt, examples)", "target")
    _box(ax, 0.3 + pw, 2.1, 6.0 - pw + 0.3, 0.55, "item", "new")
    _box(ax, 7.3, 1.9, 2.4, 0.9, "snapshot on disk\nkeyed by the model, the tokenizer\nand the prefix's tokens", "disk", fontsize=7)
    _arrow(ax, (6.6, 2.37), (7.3, 2.37))
    ax.text(6.95, 2.75, "first request:\nprefill, save", ha="center", fontsize=7)
    _box(ax, 0.3, 0.5, pw, 0.55, "restored: read, not computed", "accepted")
    _box(ax, 0.3 + pw, 0.5, 6.0 - pw + 0.3, 0.55, "item", "new")
    _arrow(ax, (8.5, 1.9), (0.3 + pw / 2, 1.08), "later request, or after a restart: restore")
    ax.text(0.3 + pw + (6.3 - pw) / 2, 0.2, "only this is prefilled", ha="center", fontsize=7)
    ax.set_title("The prefix cache: the shared prefix's KV is computed once and read back bit for bit", fontsize=9)
    fig.tight_layout()
    return fig


def one_sided_cache(threshold: float = 0.85):
    """Lesson 5: a cached answer is served only when it is a "no" (a safe negative), the query is at least
    `threshold` similar and the guard (numbers, negations) agrees; a "yes" is never served from the cache."""
    fig, ax = plt.subplots(figsize=(8, 3))
    ax.axvspan(threshold, 1.0, ymin=0.5, ymax=1.0, color=COLOURS["accepted"], alpha=0.8)
    ax.axvspan(0.0, threshold, ymin=0.5, ymax=1.0, color=COLOURS["discarded"])
    ax.axvspan(0.0, 1.0, ymin=0.0, ymax=0.5, color=COLOURS["rejected"], alpha=0.6)
    ax.axvline(threshold, color="k", lw=1)
    ax.text((threshold + 1) / 2, 0.75, "served\n(if the guard agrees)", ha="center", va="center", fontsize=8)
    ax.text(threshold / 2, 0.75, "judge runs", ha="center", va="center", fontsize=8)
    ax.text(0.5, 0.25, "never served: the judge always runs", ha="center", va="center", fontsize=8)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_yticks([0.25, 0.75], ["cached \"yes\"", "cached \"no\""])
    ax.set_xlabel("cosine similarity of the query to the cached one")
    ax.set_title(f"One-sided caching: only a safe negative above {threshold:g} is reused; a wrong reuse can only "
                 "say \"no\" twice", fontsize=9)
    fig.tight_layout()
    return fig


def the_stack():
    """Lesson 6: the capstone's pipeline, item by item: the semantic cache (lossy, audited) in front, then the
    engine's lossless path: the prefix restored, the item prefilled, drafts verified (grammar span or model)."""
    fig, ax = _canvas(w=11, h=3.0, xlim=(0, 11), ylim=(0, 3))
    steps = [("item", "plain"), ("semantic cache\n(one-sided, audited)", "disk"), ("prefix cache:\nrestore the prefix", "accepted"),
             ("prefill\nthe item", "target"), ("draft: grammar span,\nelse the model drafter", "new"),
             ("verify k+1 rows\nin one forward", "target"), ("answer\n(NDJSON line)", "plain")]
    x, centres = 0.1, []
    for i, (text, colour) in enumerate(steps):
        w = 1.0 if i in (0, 6) else 1.45
        _box(ax, x, 1.3, w, 0.8, text, colour, fontsize=7)
        if i:
            _arrow(ax, (x - 0.25, 1.7), (x, 1.7))
        centres.append(x + w / 2)
        x += w + 0.25
    ax.plot([centres[1], centres[1], centres[-1]], [1.28, 0.7, 0.7], color="#444444", lw=0.9)
    _arrow(ax, (centres[-1], 0.7), (centres[-1], 1.28))
    ax.text((centres[1] + centres[-1]) / 2, 0.45, "hit on a safe negative: the cached \"no\", no engine call",
            ha="center", fontsize=7)
    ax.text(5.5, 2.45, "lossless: every engine answer is the plain engine's, byte for byte", ha="center", fontsize=8)
    ax.set_title("The stack: each technique removes work the next would do; only the semantic cache may change an answer",
                 fontsize=9)
    fig.tight_layout()
    return fig
