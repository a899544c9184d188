"""Lesson 3 (grammar-forced drafting): the experiments and figures of notebooks/03_grammar.ipynb."""
from __future__ import annotations

import json

import jsonschema
import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.patches import Patch, Rectangle

from lessonkit.grammar.automaton import load_grammar
from lessonkit.grammar.measure import drafting_ceiling, forced_byte_fraction
from lessonkit.grammar.records import monitoring_grammar
from lessonkit.grammar.tokens import TokenGrammar
from lessonkit.lessons.headline import Column, Headline, Sentence
from lessonkit.lessons.panel import quantity_table, show_panel
from lessonkit.measure.apart import Apart, predict_speedup


def schema_answer(engine, result, schema: dict) -> tuple[str, bool]:
    """(the answer's text, whether it meets `schema`). The answer is the generated text without the
    end-of-turn token the model stopped on: json.loads fails on '{...}<|im_end|>', which would report a
    schema-valid answer as invalid."""
    ids, stop = list(result.token_ids), set(engine.config.eos_ids)
    while ids and ids[-1] in stop:
        ids.pop()
    text = engine.decode(ids).strip()
    try:
        return text, jsonschema.Draft202012Validator(schema).is_valid(json.loads(text))
    except ValueError:                      # not JSON at all
        return text, False


def speedup_predicted_and_broken_down(ab: dict, apart, timed_prompt: list[int]) -> dict:
    """Lesson 1's cost model for grammar drafts, which cost almost nothing to make (c ~ 0): the speed-up is the
    tokens per forward over what an average verify forward costs in plain steps, T(r)/T(1) at the mean rows per
    forward r (interpolated on the measured cost curve). predicted: from `apart` (a drafted run on other records,
    `measure.grammar.grammar_apart`; refused if its prompt is the timed one); breakdown: the same formula on the
    timed A/B's own tokens and rows per forward, which explains that run and predicts nothing."""
    pred = predict_speedup(apart, 0, [timed_prompt])
    same = Apart(prompts=(), source="the timed run itself", cost=apart.cost,
                 tokens_per_verify=ab["tokens_per_forward"], rows_per_verify=ab["rows_per_forward"])
    brk = predict_speedup(same, 0, [])
    return {"rows_per_forward_apart": pred["rows"], "tokens_per_forward_apart": pred["E_predicted"],
            "verify_cost_ratio_apart": pred["verify_cost"], "predicted_speedup": pred["predicted_speedup"],
            "rows_per_forward": ab["rows_per_forward"], "tokens_per_forward": ab["tokens_per_forward"],
            "breakdown_speedup": brk["predicted_speedup"], "measured_speedup": ab["speedup"]}


def forced_spans(grammar, engine, record_text: str) -> tuple[str, pd.DataFrame]:
    """One record with its forced bytes marked: walk the grammar over the record's bytes; wherever the state
    forces a continuation that the record follows, those bytes are forced (the grammar knew them). Returns the
    record with forced spans in [brackets], and its tokens (as the model tokenises the record) with how many
    of each token's bytes were forced."""
    data = record_text.encode("utf-8")
    forced = [False] * len(data)
    state, i = grammar.initial(), 0
    while i < len(data):
        f = state.forced_continuation()
        if f and data[i:i + len(f)] == f:
            forced[i:i + len(f)] = [True] * len(f)
            state, i = state.advance_bytes(f), i + len(f)
        else:
            state, i = state.advance_bytes(data[i:i + 1]), i + 1
    marked, inside = [], False
    for b, fz in zip(data, forced):
        if fz != inside:
            marked.append(b"[" if fz else b"]")
            inside = fz
        marked.append(bytes([b]))
    marked = b"".join(marked + ([b"]"] if inside else [])).decode("utf-8", "replace")
    rows, pos = [], 0
    for t in engine.encode(record_text):
        tb = engine.token_bytes(t)
        n_forced = sum(forced[pos:pos + len(tb)])
        rows.append({"token": repr(tb.decode("utf-8", "replace")), "bytes": len(tb), "forced bytes": n_forced,
                     "draftable": "whole token" if n_forced == len(tb) else ("part" if n_forced else "")})
        pos += len(tb)
    return marked, pd.DataFrame(rows)


def forced_fraction_table(records: list[dict]):
    """Forced bytes of the same records written compactly and sloppily, under generic and schema grammars."""
    compact = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records).encode()
    sloppy = "".join(json.dumps(r) + "\n" for r in records).encode()
    rows = []
    for text_name, data, grammars in [
            ("compact", compact, [("ndjson-compact", load_grammar("ndjson-compact")),
                                  ("record schema, compact", monitoring_grammar(whitespace="compact"))]),
            ("sloppy (', ' and ': ')", sloppy, [("ndjson (whitespace-tolerant)", load_grammar("ndjson")),
                                               ("record schema, flexible", monitoring_grammar(whitespace="flexible"))])]:
        for gname, g in grammars:
            rows.append({"text": text_name, "grammar": gname, "bytes": len(data),
                         "forced fraction": forced_byte_fraction(g, data)})
    return pd.DataFrame(rows)


def _record_grammar(grammar: str, writing: str):
    compact = writing == "compact"
    if grammar == "record schema":
        return monitoring_grammar(whitespace="compact" if compact else "flexible")
    return load_grammar("ndjson-compact" if compact else "ndjson")


def forcing_table(engine, records: list[dict], *, record_type: str = "all", writing: str = "compact",
                  grammar: str = "record schema") -> pd.DataFrame:
    """Lesson 3's panel, one choice: the records of one type written compactly or sloppily, under the record
    schema or a generic NDJSON grammar: forced bytes, and what the grammar drafter would reach if the model
    wrote exactly these records (drafting_ceiling). A table with units."""
    picked = [r for r in records if record_type in ("all", r.get("type"))]
    lines = [(json.dumps(r, separators=(",", ":")) if writing == "compact" else json.dumps(r)) + "\n" for r in picked]
    g = _record_grammar(grammar, writing)
    forced = forced_byte_fraction(g, "".join(lines).encode())
    c = drafting_ceiling(TokenGrammar(g, engine.tokenizer, eos_ids=engine.config.eos_ids),
                         [engine.encode(line) for line in lines])
    pct = lambda x, none: none if x is None else f"{100 * x:.1f}"   # noqa: E731
    rows = [("records", f"{len(picked)}", f"{record_type} records, {writing}"),
            ("bytes forced by the grammar", pct(forced, "n/a (the text leaves the grammar)"), "% of bytes"),
            ("tokens drafted and accepted", pct(c["forced_fraction"], ""), f"% of {c['tokens']} tokens"),
            ("tokens per forward (ceiling)", f"{c['tokens_per_forward']:.2f}", "tokens / forward"),
            ("grammar acceptance", pct(c["grammar_acceptance"], "n/a (nothing drafted)"), "% of drafted tokens")]
    return quantity_table(rows)


def forcing_panel(engine, records: list[dict]) -> None:
    """Record type, writing style and grammar over `forcing_table`."""
    import ipywidgets as w
    kinds = ["all", *sorted({r.get("type", "?") for r in records})]
    show_panel({"record_type": w.Dropdown(options=kinds, description="record type"),
                "writing": w.Dropdown(options=["compact", "sloppy"], description="written"),
                "grammar": w.Dropdown(options=["record schema", "generic NDJSON"], description="grammar")},
               lambda **kw: forcing_table(engine, records, **kw),
               title="What a grammar forces, and what drafting could gain from it")


def plot_forced_fractions(df):
    fig, ax = plt.subplots(figsize=(7, 3.2))
    labels = [f"{t}\n{g}" for t, g in zip(df["text"], df["grammar"])]
    vals = [100 * (v or 0) for v in df["forced fraction"]]
    ax.bar(range(len(vals)), vals, color=["#4477aa", "#228833", "#cc6677", "#ddaa33"][:len(vals)])
    ax.set_xticks(range(len(vals)), labels, fontsize=7)
    ax.set_ylabel("bytes forced by the grammar (%)")
    for i, v in enumerate(vals):
        ax.annotate(f"{v:.0f}%", (i, v), ha="center", va="bottom", fontsize=8)
    best = df.loc[df["forced fraction"].fillna(0).idxmax()]
    sloppy = df.loc[df["grammar"] == "record schema, flexible", "forced fraction"].fillna(0)
    ax.set_title(f"A schema over compact records forces {100 * best['forced fraction']:.0f}% of the bytes; "
                 f"over sloppy ones {100 * float(sloppy.iloc[0]) if len(sloppy) else 0:.0f}%", fontsize=9)
    fig.tight_layout()
    return fig


def ab_table(results: dict):
    """{label: grammar_ab result} -> DataFrame for the lesson."""
    return pd.DataFrame([{"run": k, "plain tok/s": r["plain_tokens_per_s"], "drafted tok/s": r["drafted_tokens_per_s"],
                          "speed-up": r["speedup"], "tokens/forward": r["tokens_per_forward"],
                          "grammar acceptance": r["grammar_acceptance"], "forced fraction": r["forced_fraction"],
                          "identical": r["identical"], "plain expert hit rate": r["plain_expert_hit_rate"],
                          "drafted expert hit rate": r["drafted_expert_hit_rate"]} for k, r in results.items()])


def plot_ab(df):
    fig, ax = plt.subplots(figsize=(6, 3.2))
    x = range(len(df))
    ax.bar([i - 0.2 for i in x], df["plain tok/s"], 0.4, label="plain greedy", color="#999999")
    ax.bar([i + 0.2 for i in x], df["drafted tok/s"], 0.4, label="grammar drafted", color="#228833")
    ax.set_xticks(list(x), df["run"])
    ax.set_ylabel("tokens per second")
    ax.legend(fontsize=8)
    for i, s_ in enumerate(df["speed-up"]):
        ax.annotate(f"{s_:.2f}x", (i + 0.2, df["drafted tok/s"].iloc[i]), ha="center", va="bottom", fontsize=8)
    if len(df) > 1:
        title = (f"Warming only the drafted arm shows {df['speed-up'].iloc[-1]:.2f}x; "
                 f"controlled, the gain is {df['speed-up'].iloc[0]:.2f}x")
    else:
        title = f"Grammar drafting: {df['speed-up'].iloc[0]:.2f}x, same bytes"
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig


SOURCE_COLOURS = {"drafted": "#7fc97f", "forced": "#fdc086", "free": "#ffffff"}


def plot_byte_sources(sources: list[tuple[int, str]], *, width: int = 64, title: str | None = None):
    """The generated text, one cell per byte, coloured by where it came from. Returns a Figure."""

    rows = max(1, (len(sources) + width - 1) // width)
    fig, ax = plt.subplots(figsize=(width * 0.16, 0.32 * rows + 1.0))
    for i, (byte, label) in enumerate(sources):
        x, y = i % width, rows - 1 - i // width
        ax.add_patch(Rectangle((x, y), 1, 1, facecolor=SOURCE_COLOURS[label], edgecolor="none"))
        ch = chr(byte) if 0x20 <= byte < 0x7F else ("⏎" if byte == 10 else "·")
        ax.text(x + 0.5, y + 0.5, ch, ha="center", va="center", family="monospace", fontsize=7)
    ax.set_xlim(0, width)
    ax.set_ylim(0, rows)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_xlabel(f"generated bytes ({width} per row)")
    counts = {k: sum(1 for _, lab in sources if lab == k) for k in SOURCE_COLOURS}
    n = max(len(sources), 1)
    ax.legend(handles=[Patch(facecolor=SOURCE_COLOURS[k], edgecolor="grey",
                             label=f"{k}: {100 * counts[k] / n:.0f}% of bytes") for k in SOURCE_COLOURS],
              loc="upper center", bbox_to_anchor=(0.5, -0.02), ncol=3, fontsize=8, frameon=False)
    ax.set_title(title or f"{100 * counts['drafted'] / n:.0f}% of the bytes came from accepted grammar drafts")
    return fig


HEADLINE = Headline(
    title="Grammar-forced drafting",
    sentences=(
        Sentence("Under the monitoring-record schema {forced_fraction_compact_schema:.0%} of a compact record's "
                 "bytes are forced by the grammar ({forced_fraction_sloppy_schema:.0%} when written loosely); "
                 "compiling a schema took at most {schema_compile_ms_max:.1f} ms."),
        Sentence("Controlled A/B (both arms with the same experts warm): grammar drafting ran "
                 "{controlled_speedup:.2f}x plain greedy at {tokens_per_forward:.2f} tokens per forward (lesson 1's "
                 "cost model predicted {predicted_speedup:.2f}x from a run on other records; the same run's breakdown "
                 "{breakdown_speedup:.2f}x); warming only the drafted arm, the confounded "
                 "comparison showed {confounded_speedup:.2f}x."),
        Sentence("{grammar_acceptance:.0%} of grammar drafts were accepted.", when="grammar_acceptance"),
        Sentence("A model that wrote valid records could reach {ceiling_tokens_per_forward:.2f} tokens per forward "
                 "with grammar drafting (this run: {tokens_per_forward:.2f})."),
        Sentence("{noncanonical_span_fraction:.1%} of forced spans tokenise differently from the model's own "
                 "tokenisation ({resyncs} resyncs), and the drafted output was "
                 "{identical_to_plain:identical to|DIFFERENT from} plain greedy."),
    ),
    columns=(Column("run", "run"), Column("plain tok/s", "plain (tokens/s)", ".1f"),
             Column("drafted tok/s", "drafted (tokens/s)", ".1f"), Column("speed-up", "speed-up (x)", ".2f"),
             Column("tokens/forward", "tokens per forward", ".2f"),
             Column("grammar acceptance", "draft acceptance (%)", ".0f", scale=100),
             Column("forced fraction", "tokens from grammar drafts (%)", ".0f", scale=100),
             Column("plain expert hit rate", "expert hit rate, plain (%)", ".0f", scale=100),
             Column("drafted expert hit rate", "expert hit rate, drafted (%)", ".0f", scale=100),
             Column("identical", "output vs plain greedy", "identical|DIFFERS")),
    caption="Plain vs grammar-drafted decoding, controlled and confounded",
    figure="lesson.plot_ab(",
)
