"""The capstone measured: the stack's ablation (each row a set of techniques on the same workload, against the
plain engine, answers compared; ablation_all on every model, headline its figures), the drafter chosen by
timing, one item side by side. Lesson 6 draws it; `lessonkit stack run` and `lessonkit bench stack` report it."""
from __future__ import annotations

import tempfile
from dataclasses import replace
from typing import NamedTuple

import pandas as pd
from tqdm.auto import tqdm

from lessonkit.engine.config import ModelConfig
from lessonkit.errors import LessonkitError
from lessonkit.engine.threads import torch_threads
from lessonkit.models.registry import MODELS_DIR, load_model
from lessonkit.measure.stack_prediction import drafter_row_prediction
from lessonkit.mtp.head import head_path
from lessonkit.semcache.judge import recorded_answers, trained_prompt
from lessonkit.stack import (PRESETS, TECHNIQUES, StackConfig, StackPipeline, StackRun, embed_workload,
                             judge_token_grammar, run_stack)
from lessonkit.workloads.triage import Workload, make_workload, needs_action

ROWS = {                           # row name -> techniques on
    "plain engine": (),
    "semantic cache": ("semcache",),
    "prefix cache": ("prefix",),
    "grammar drafting": ("grammar",),
    "model drafter": ("drafter",),
    "lossless together": ("prefix", "grammar", "drafter"),    # every answer the plain engine's, byte for byte
    "all together": TECHNIQUES,                                # the same behind the lossy, audited semantic cache
}
# what the drafting choice may also pick instead of a model drafter behind the grammar: the grammar's forced
# spans alone, or no drafts at all (the plain decode behind the prefix cache)
NO_MODEL_DRAFTER = {"grammar only": ("prefix", "grammar"), "no drafts": ("prefix",)}


def techniques_for(row: str, choice: str | None) -> tuple:
    """The techniques a row runs: the combined rows take the drafting choice (NO_MODEL_DRAFTER drops the model
    drafter, or the grammar too); the single-technique rows run as named."""
    techs = ROWS[row]
    if row in ("lossless together", "all together") and choice in NO_MODEL_DRAFTER:
        keep = set(NO_MODEL_DRAFTER[choice]) | {"semcache"}
        techs = tuple(t for t in techs if t in keep)
    return techs

def drafter_candidates(engine, names=("mtp", "tiny-draft", "ngram")) -> list[str]:
    """The model drafters that exist for this engine (an MTP head trained for it, a draft model with
    its vocabulary, prompt lookup always)."""
    out = []
    for n in names:
        if n == "mtp":
            if head_path(engine.name).exists():
                out.append(n)
        elif n == "tiny-draft":
            cfg_path = MODELS_DIR / "tiny-draft" / "config.json"
            if engine.name != "tiny-draft" and cfg_path.exists() and \
                    ModelConfig.load(cfg_path).vocab_size == engine.config.vocab_size:
                out.append(n)
        else:
            out.append(n)
    return out

def choose_drafter(engine, workload: Workload, cfg: StackConfig = StackConfig(), token_grammar=None):
    """Time grammar + each candidate on the calibration items (behind a warm prefix cache, as in the full
    stack), and the grammar alone and no drafts at all (NO_MODEL_DRAFTER), each at the config's depth (the depth
    gate's by default); returns (the fastest: a drafter name or a NO_MODEL_DRAFTER key, DataFrame of the
    measurements)."""
    cands = drafter_candidates(engine, cfg.drafters)
    cal = Workload(workload.calibration or workload.items[:1], [], [], workload.prefix)
    rows = []
    with tempfile.TemporaryDirectory(prefix="lessonkit-stack-cal-") as d:
        c = replace(cfg, progress=False)
        run_stack(engine, cal, ("prefix",), cfg=c, prefix_cache_dir=d, token_grammar=token_grammar)   # warm
        for name in [*cands, *NO_MODEL_DRAFTER]:
            techs = NO_MODEL_DRAFTER.get(name, ("prefix", "grammar", "drafter"))
            try:
                r = run_stack(engine, cal, techs, cfg=c, model_drafter=None if name in NO_MODEL_DRAFTER else name,
                              prefix_cache_dir=d, token_grammar=token_grammar)
            except LessonkitError as e:            # e.g. a head that does not fit this model
                rows.append({"drafter": name, "wall_s": None, "tokens_per_s": None, "note": str(e)})
                continue
            rows.append({"drafter": name, "wall_s": r.wall_s, "tokens_per_s": r.engine_tokens / r.wall_s,
                         "forwards": r.forwards, "model_accepted": r.extra.get("model_accepted", 0),
                         "model_proposed": r.extra.get("model_proposed", 0), "note": ""})
    df = pd.DataFrame(rows)
    ok = df.dropna(subset=["wall_s"]) if len(df) else df
    if not len(ok):
        return None, df
    best = ok.sort_values("wall_s").iloc[0]["drafter"]
    return str(best), df

def one_item(engine, workload: Workload, cfg: StackConfig = StackConfig(), index: int = 0,
             model_drafter: str | None = "ngram"):
    """One item, plain engine vs the engine techniques together: the answers side by side (DataFrame)."""
    wl = Workload(workload.items[index:index + 1], [], [], workload.prefix)
    c = replace(cfg, progress=False)
    rows = []
    with tempfile.TemporaryDirectory(prefix="lessonkit-stack-one-") as d, torch_threads(cfg.threads):
        run_stack(engine, wl, (), cfg=c)        # warm-up (first-touch of weights, allocator)
        for name, tech in [("plain engine", ()), ("prefix cache, cold", ("prefix", "grammar", "drafter")),
                           ("prefix cache, warm", ("prefix", "grammar", "drafter"))]:
            r = run_stack(engine, wl, tech, cfg=c, model_drafter=model_drafter, prefix_cache_dir=d, name=name)
            rows.append({"run": name, "answer": r.answers[0], "forwards": r.forwards, "wall_s": r.wall_s,
                         "grammar_accepted": r.extra.get("grammar_accepted"),
                         "model_accepted": r.extra.get("model_accepted")})
    df = pd.DataFrame(rows)
    df["identical_to_plain"] = df["answer"] == df["answer"].iloc[0]
    return df

# ---- the ablation ---------------------------------------------------------------------------------
ABLATION_COLUMNS = ["model", "row", "techniques", "lossless", "wall_s", "speedup", "tokens_per_s", "forwards", "expert_bytes",
                    "judge_calls", "identical_to_plain", "engine_answers_identical", "answers_differing",
                    "cache_hits", "audits", "audited_losses", "actionable_losses", "model_drafter"]

def _losses(run: StackRun, plain: StackRun) -> tuple[int, int]:
    """(losses, actionable losses) of answers served from the cache, against the plain engine."""
    loss = act = 0
    for a, s, p in zip(run.answers, run.sources, plain.answers):
        if s != "cache":
            continue
        served, fresh = needs_action(a), needs_action(p)
        loss += served != fresh
        act += fresh and not served
    return loss, act

def ablation(engine, cfg: StackConfig | str = "default", *, rows=None, embeddings=None, embed_s: float = 0.0,
             workload=None, model_drafter: str | None = "auto") -> tuple:
    """Plain engine, each technique on its own, all together, on one engine.

    Returns (DataFrame with ABLATION_COLUMNS, dict of the StackRuns, drafter DataFrame). Timing runs
    with torch_threads(cfg.threads); the embedding time (once per stream) is added to the
    rows that use the semantic cache.
    """
    cfg = PRESETS[cfg] if isinstance(cfg, str) else cfg
    rows = list(ROWS) if rows is None else list(rows)
    if "plain engine" not in rows:
        rows.insert(0, "plain engine")
    for r in rows:
        if r not in ROWS:
            raise LessonkitError(f"unknown ablation row {r!r}: choose from {', '.join(ROWS)}")
    wl = model_workload(workload or make_workload(cfg), engine.name)
    with torch_threads(cfg.threads):
        tg = judge_token_grammar(engine)
        if any("semcache" in ROWS[r] for r in rows) and embeddings is None:
            embeddings, embed_s = embed_workload(wl)
        draft_df, choice = None, model_drafter
        if model_drafter == "auto":
            choice, draft_df = choose_drafter(engine, wl, cfg, tg)
            model_drafter = choice
            if choice in NO_MODEL_DRAFTER:          # the single "model drafter" row still runs the fastest model drafter
                ok = draft_df[~draft_df.drafter.isin(list(NO_MODEL_DRAFTER))].dropna(subset=["wall_s"])
                model_drafter = str(ok.sort_values("wall_s").iloc[0]["drafter"]) if len(ok) else "ngram"
        # warm-up: one item through the plain engine (allocator, expert cache, tokenizer)
        run_stack(engine, Workload(wl.items[:1], [], [], wl.prefix), (), cfg=replace(cfg, progress=False))
        # every configuration runs item by item, interleaved (order rotated per item), so that the
        # machine's drift (other processes) lands on all rows alike
        pipes = {r: StackPipeline(engine, wl, techniques_for(r, choice), cfg=cfg, embeddings=embeddings,
                                  model_drafter=model_drafter, token_grammar=tg, name=r) for r in rows}
        if wl.warm and any(p.front is not None for p in pipes.values()):    # a cache that has been running
            recorded = recorded_answers(engine, wl.prefix, cfg.max_new_tokens)
            for p in pipes.values():
                p.warm_up(wl.warm, recorded, progress=cfg.progress)
        for i, text in enumerate(tqdm(wl.texts, desc=f"ablation {engine.name}", disable=not cfg.progress)):
            for j in range(len(rows)):
                pipes[rows[(i + j) % len(rows)]].step(i, text)
        runs = {r: p.finish() for r, p in pipes.items()}
        for r in rows:
            if "semcache" in ROWS[r]:
                runs[r].wall_s += embed_s
        pred = (drafter_row_prediction(engine, wl, model_drafter, max_new_tokens=cfg.max_new_tokens, k=cfg.k)
                if "model drafter" in rows and model_drafter else None)
    df = ablation_table(engine.name, runs, rows, model_drafter, choice)
    if pred is not None:             # lesson 1's formula, from quantities measured apart (measure.stack_prediction)
        at = df.row == "model drafter"
        for col, key in PREDICTION_COLUMNS.items():
            df.loc[at, col] = pred[key]
    return df, runs, draft_df


PREDICTION_COLUMNS = {"predicted_speedup": "predicted_speedup", "E_apart": "E", "c_apart": "c",
                      "verify_cost_apart": "verify_cost", "decode_share": "decode_share"}

def ablation_table(model: str, runs: dict, rows: list[str], model_drafter, choice=None) -> pd.DataFrame:
    """One row per configuration against the plain engine's run: speed, identity (every item, cache answers
    included; and the engine's own answers), the semantic cache's losses."""
    plain = runs["plain engine"]
    out = []
    for r in rows:
        run = runs[r]
        eng_items = [i for i, s in enumerate(run.sources) if s != "cache"]
        engine_identical = all(run.answers[i] == plain.answers[i] for i in eng_items)
        differing = sum(a != b for a, b in zip(run.answers, plain.answers))   # every item, cache answers included
        loss, act = _losses(run, plain)
        techs = techniques_for(r, choice)
        out.append({"model": model, "row": r, "techniques": "+".join(techs) or "none", "lossless": "semcache" not in techs,
                    "wall_s": run.wall_s, "speedup": plain.wall_s / run.wall_s,
                    "tokens_per_s": run.answer_tokens / run.wall_s, "forwards": run.forwards,
                    "expert_bytes": run.expert_bytes, "judge_calls": run.judge_calls,
                    "identical_to_plain": differing == 0, "engine_answers_identical": engine_identical,
                    "answers_differing": differing, "cache_hits": run.hits, "audits": run.audits,
                    "audited_losses": run.audit_losses if "semcache" in techs else None,
                    "actionable_losses": act if "semcache" in techs else None,
                    "losses": loss if "semcache" in techs else None,
                    "model_drafter": (model_drafter if "drafter" in techs else
                                      choice if r in ("lossless together", "all together") else None),
                    "cached_positives_served": run.extra.get("cached_positives_served"),
                    "cache_serving": run.extra.get("cache_serving")})
    return pd.DataFrame(out)

class ModelAblation(NamedTuple):
    """One model's ablation: its table, its runs by row, the drafter choice's table, the stream's embed time."""
    engine: object
    table: pd.DataFrame
    runs: dict
    drafters: pd.DataFrame
    embed_s: float


def ablations(models, cfg: StackConfig, *, rows=None):
    """ablation() on each model in turn, the stream embedded once: yields a ModelAblation per model.
    ablation_all keeps the tables; `lessonkit bench stack` also reads the runs' answers."""
    wl = make_workload(cfg)
    emb, embed_s = embed_workload(wl)
    for m in models:
        eng = load_engine(m)
        df, runs, ddf = ablation(eng, cfg, rows=rows, embeddings=emb, embed_s=embed_s, workload=wl)
        yield ModelAblation(eng, df, runs, ddf, embed_s)


def ablation_all(models=None, cfg: StackConfig | str = "default", *, smoke: bool = False) -> tuple:
    """ablation() on each model (tiny-moe when trained, smollm2-135m); the stream is embedded once.

    Returns (DataFrame, {model: drafter DataFrame}); lesson 6 draws the table (lessonkit.lessons.stack),
    `lessonkit stack run` prints it.
    """
    cfg = PRESETS[cfg] if isinstance(cfg, str) else cfg
    frames, drafts = [], {}
    for a in ablations(models or available_models(smoke), cfg):
        frames.append(a.table)
        drafts[a.engine.name] = a.drafters
    return pd.concat(frames, ignore_index=True), drafts

def headline(df) -> dict:
    """The figures lesson 6 records and `lessonkit stack run` prints: per model, all-together speed-up and
    exactness, plus cache losses."""
    out = {}
    for m, sub in df.groupby("model", sort=False):
        s = sub.set_index("row")
        key = m.replace("-", "_").replace(".", "_")
        if "all together" in s.index:
            a = s.loc["all together"]
            out[f"{key}_all_speedup"] = round(float(a["speedup"]), 3)
            out[f"{key}_all_identical"] = bool(a["identical_to_plain"])
            out[f"{key}_all_answers_differing"] = int(a["answers_differing"])
            out[f"{key}_all_engine_identical"] = bool(a["engine_answers_identical"])
            out[f"{key}_all_actionable_losses"] = int(a["actionable_losses"] or 0)
            out[f"{key}_all_judge_calls"] = int(a["judge_calls"])
        if "model drafter" in s.index and "predicted_speedup" in s.columns:
            d = s.loc["model drafter"]
            out[f"{key}_drafter_speedup"] = round(float(d["speedup"]), 3)
            out[f"{key}_drafter_predicted_speedup"] = round(float(d["predicted_speedup"]), 3)   # NaN: nothing to predict from
        if "lossless together" in s.index:
            b = s.loc["lossless together"]
            out[f"{key}_lossless_speedup"] = round(float(b["speedup"]), 3)
            out[f"{key}_lossless_identical"] = bool(b["identical_to_plain"])
            out[f"{key}_lossless_techniques"] = str(b["techniques"])
        out[f"{key}_plain_tokens_per_s"] = round(float(s.loc["plain engine", "tokens_per_s"]), 3)
        out[f"{key}_engine_rows_identical"] = bool(sub["engine_answers_identical"].all())
    return out

def smoke_engine():
    """The engine of smoke runs: tiny-moe."""
    return load_model("tiny-moe")

def available_models(smoke: bool = False) -> list[str]:
    """The capstone's judges: each model's trained judge (lessonkit train judge) where it ships, else the model."""
    if smoke:
        return ["smoke"]
    out = ["tiny-moe"] if (MODELS_DIR / "tiny-moe" / "config.json").exists() else []
    out += ["smollm2-135m"]
    return [f"{m}-judge" if (MODELS_DIR / f"{m}-judge" / "adapter.json").exists() else m for m in out]

def model_workload(wl: Workload, model: str) -> Workload:
    """The workload as `model` is prompted: a trained judge keeps the prefix it was trained with (its own
    instruction and few-shot examples from the training vocabulary); other models the stream's few-shot prefix."""
    spec = trained_prompt(model)
    return wl if spec is None else replace(wl, prefix=spec["prefix"])

def load_engine(name: str):
    """A named model, a checkpoint directory, or "smoke" (smoke_engine())."""
    if name == "smoke":
        return smoke_engine()
    return load_model(name)

def run_config(args, smoke: bool) -> StackConfig:
    """The preset for a run (smoke or default), cut to --limit items, --warm-items warm-up items, quiet with --json."""
    cfg = PRESETS["smoke" if smoke else "default"]
    if getattr(args, "limit", None):
        cfg = replace(cfg, n_items=int(args.limit))
    if getattr(args, "warm_items", None) is not None:
        cfg = replace(cfg, warm_items=int(args.warm_items))
    if getattr(args, "json", False):
        cfg = replace(cfg, progress=False)
    return cfg
