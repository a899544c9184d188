"""`lessonkit train judge --model M`: teach the monitoring task to a workbook model with a LoRA adapter.

Recipe (cheap on a CPU): the judge's prompt is a fixed prefix (instruction + few-shot examples,
lessonkit.training.judge_data.judge_prefix) then the item, then the answer line. Only the last
`n_top` layers get adapters, so

  1. the frozen bottom layers run once over the prefix and once over every training example
     (item + answer), and their output is cached;
  2. each step runs the prefix through the adapted top layers without gradient (its keys and values
     are shared by the batch), then a batch of cached examples with gradient; the loss is the
     cross-entropy of the answer tokens only, the needs_action token weighted `decision_weight` times;
  3. the adapter (scale folded in) is written to data/models/<model>-judge/ with its card; the
     engine loads base weights + adapter merged (lessonkit.models.adapters).

Everything is seeded and runs on `threads` torch threads with deterministic algorithms, so a rerun
gives the same adapter on the same machine and library versions.
"""
from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from tqdm.auto import tqdm

from lessonkit.files.atomic import atomic_write
from lessonkit.engine.machine import machine_record
from lessonkit.errors import LessonkitError
from lessonkit.engine.threads import pin_torch_threads
from lessonkit.models.integrity import write_manifest
from lessonkit.models.registry import MODELS_DIR, load_model, resolve_model_dir
from lessonkit.semcache.judge import (agreement, answer_head, answers_path, load_trained_judge, write_answer_lines,
                                      write_ground_truth)
from lessonkit.training.judge_ndjson import ndjson_answers
from lessonkit.training.judge_data import (N_SHOTS, TRAIN_STREAM, check_disjoint, judge_answer, judge_prefix,
                                           training_items)
from lessonkit.training.lora import ATTN, MLP, LoraModel
from lessonkit.workloads.monitoring import load_stream
from lessonkit.workloads.triage import ITEM_TEMPLATE, parse_answer


@dataclass(frozen=True)
class JudgeTrainConfig:
    model: str                      # base model name
    n_top: int                      # adapted (last) layers
    rank: int = 16
    alpha: float = 32.0
    targets: tuple = ATTN + MLP
    epochs: int = 3                 # epochs per cycle
    cycles: int = 1                 # warm restarts: a fresh optimizer and learning-rate schedule per cycle
    batch: int = 16
    lr: float = 2e-3
    warmup: int = 20
    decision_weight: float = 4.0    # weight of the needs_action token in the loss
    full_share: float = 0.25        # share of examples trained on the whole answer (the rest: the needs_action token)
    n_originals: int = TRAIN_STREAM.n_originals
    n_shots: int = N_SHOTS
    wide_phrasings: bool = False    # train on judge_data.EXTRA_PHRASINGS too (more wordings per family)
    wide_entities: bool = False     # names from judge_data.WIDE_TRAIN_POOLS (hundreds of hosts, IPs, ...)
    grammar_phrasings: bool = False # the wide wordings and judge_data's wording grammar (20-57 wordings per family)
    unit_change_weight: float = 1.0 # a hard negative is a unit change this many times as often as another kind
    ten_net_ips: bool = False       # with wide_entities: IPs from judge_data.TEN_NET_IPS too (10.x, no shipped subnet)
    seed: int = 0
    threads: int = 1

    @property
    def name(self) -> str:
        return f"{self.model}-judge"


PRESETS = {
    "smollm2-135m": JudgeTrainConfig("smollm2-135m", n_top=4, epochs=4, cycles=3, n_originals=700, threads=2,
                                     wide_entities=True, grammar_phrasings=True, unit_change_weight=2.5),
    "tiny-moe": JudgeTrainConfig("tiny-moe", n_top=4, rank=32, alpha=64.0, epochs=6, lr=3e-3, full_share=0.4,
                                 n_originals=1500, n_shots=0, wide_phrasings=True),
}


def encode_examples(engine, items) -> list[tuple[list[int], list[int]]]:
    """(item prompt ids, answer ids incl. the closing newline) per item, tokenised as the judge sees them."""
    head = answer_head(engine)
    out = []
    for it in items:
        a = engine.encode(judge_answer(it) + "\n")
        if a[:len(head)] != head:
            raise LessonkitError(f"answer of {it.text!r} does not start with the answer head")
        out.append((engine.encode(ITEM_TEMPLATE.format(text=it.text)), a))
    return out


def _pad(seqs: list[list[int]]) -> torch.Tensor:
    L = max(map(len, seqs))
    return torch.tensor([s + [0] * (L - len(s)) for s in seqs])


def example_inputs(examples, full: list[bool], head_len: int) -> list[list[int]]:
    """Input ids per example: the item and the answer up to the token before the last one trained on."""
    return [q + (a[:-1] if f else a[:head_len]) for (q, a), f in zip(examples, full)]


def cache_bottom(model: LoraModel, prefix_ids, seqs, batch: int = 32, progress: bool = True):
    """Frozen bottom layers over the prefix and every example's input ids."""
    P = len(prefix_ids)
    xp, kvp = model.bottom(torch.tensor([prefix_ids]), 0)
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    hidden = [None] * len(seqs)
    for b in tqdm(range(0, len(order), batch), desc="judge: frozen layers (once)", disable=not progress):
        idx = order[b:b + batch]
        x, _ = model.bottom(_pad([seqs[i] for i in idx]), P, kvp)
        for r, i in enumerate(idx):
            hidden[i] = x[r, :len(seqs[i])].clone()
    return xp, hidden


def _batch(hidden, examples, full, idx, head_len: int, decision_weight: float):
    """Padded hidden [B, S, D], the (row, position) of every trained token's prediction, targets, weights."""
    L = max(hidden[i].shape[0] for i in idx)
    x = torch.zeros(len(idx), L, hidden[idx[0]].shape[1])
    rows, pos, tgt, wts = [], [], [], []
    for r, i in enumerate(idx):
        h = hidden[i]
        x[r, :h.shape[0]] = h
        q, a = examples[i]
        for j, tok in enumerate(a):
            if not full[i] and j != head_len:
                continue
            rows.append(r)
            pos.append(len(q) - 1 + j)
            tgt.append(tok)
            wts.append(decision_weight if j == head_len else 1.0)
    return x, torch.tensor(rows), torch.tensor(pos), torch.tensor(tgt), torch.tensor(wts)


def train_adapter(cfg: JudgeTrainConfig, progress: bool = True, resume: Path | None = None) -> tuple[LoraModel, dict]:
    """Train the adapter; returns the model (with its LoRA factors) and a log.

    Training runs `cycles` cycles of `epochs` epochs, each with a fresh AdamW and its own warm-up and linear
    decay. resume: an adapter directory written after the first k cycles of this same config; its factors
    are loaded, the shuffles of the done cycles replayed, and training goes on from cycle k (the result is
    the one an uninterrupted run gives)."""
    torch.manual_seed(cfg.seed)
    pin_torch_threads(cfg.threads)
    torch.use_deterministic_algorithms(True)
    t0 = time.perf_counter()
    stream = replace(TRAIN_STREAM, n_originals=cfg.n_originals,
                     perturbation_weights=(("unit_change", cfg.unit_change_weight),) if cfg.unit_change_weight != 1 else ())
    items = training_items(stream, wide=cfg.wide_phrasings,
                           wide_entities=cfg.wide_entities, grammar=cfg.grammar_phrasings, ten_net_ips=cfg.ten_net_ips)
    disjoint = check_disjoint(items, load_stream())
    engine = load_model(cfg.model)
    model = LoraModel(resolve_model_dir(cfg.model)[1], cfg.n_top, cfg.rank, cfg.alpha, cfg.targets, cfg.seed)
    prefix_ids = engine.encode(judge_prefix(cfg.n_shots))
    examples = encode_examples(engine, items)
    head_len = len(answer_head(engine))
    frng = random.Random(cfg.seed + 1)
    full = [frng.random() < cfg.full_share for _ in examples]
    xp, hidden = cache_bottom(model, prefix_ids, example_inputs(examples, full, head_len), progress=progress)
    t_cache = time.perf_counter() - t0
    rng, losses, done, times = random.Random(cfg.seed), [], 0, []
    if resume is not None:
        done, losses, times = _resume(model, resume, cfg, rng, len(examples))
    batches = (hidden, examples, full, head_len, xp, len(prefix_ids))
    n_steps = cfg.cycles * cfg.epochs * -(-len(examples) // cfg.batch)
    bar = tqdm(total=n_steps, initial=len(losses), desc=f"judge: train {cfg.model}", disable=not progress)
    for _ in range(done, cfg.cycles):
        t1 = time.perf_counter()
        _train_cycle(model, cfg, batches, rng, losses, bar)
        times.append(round(time.perf_counter() - t1, 1))
    bar.close()
    log = {"config": asdict(cfg), "train_items": len(items), "train_tokens": sum(len(q) + len(a) for q, a in examples),
           "full_answer_examples": sum(full), "input_tokens": sum(h.shape[0] for h in hidden),
           "prefix_tokens": len(prefix_ids), "steps": n_steps, "losses": losses, "cache_s": round(t_cache, 1),
           "cycle_s": times, "train_time_s": round(t_cache + sum(times), 1), "disjointness": disjoint,
           "threads": cfg.threads, "machine": machine_record(refuse_bad_weights=False)}
    if resume is not None:
        log["resumed_after_cycles"] = done
    return model, log


def _resume(model: LoraModel, adapter_dir: Path, cfg: JudgeTrainConfig, rng: random.Random, n: int):
    """Load a partly trained adapter; replay the shuffles of its cycles. Returns (cycles done, losses, times)."""
    from safetensors.torch import load_file
    log = json.loads((adapter_dir / "train_log.json").read_text(encoding="utf-8"))
    if {k: v for k, v in log["config"].items() if k != "cycles"} != \
            {k: v for k, v in json.loads(json.dumps(asdict(cfg))).items() if k != "cycles"}:
        raise LessonkitError(f"{adapter_dir}: trained with another configuration, cannot resume")
    tensors = load_file(adapter_dir / "adapter.safetensors")
    with torch.no_grad():
        for key, p in model.lora.items():
            name, part = key[:-3].replace("__", "."), key[-1]
            p.copy_(tensors[f"{name}.lora_{part}"] / (model.scale if part == "B" else 1.0))
    done = len(log["losses"]) // (cfg.epochs * -(-n // cfg.batch))
    for _ in range(done * cfg.epochs):
        rng.shuffle(list(range(n)))
    return done, list(log["losses"]), list(log.get("cycle_s", [log["train_time_s"] - log["cache_s"]]))


def _train_cycle(model: LoraModel, cfg: JudgeTrainConfig, batches, rng: random.Random, losses: list, bar) -> None:
    """`cfg.epochs` epochs with a fresh AdamW, warm-up then linear decay to 5% of cfg.lr."""
    hidden, examples, full, head_len, xp, P = batches
    opt = torch.optim.AdamW(list(model.lora.parameters()), lr=cfg.lr, weight_decay=0.0)
    n_steps = cfg.epochs * -(-len(examples) // cfg.batch)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / cfg.warmup) *
                                              max(0.05, 1 - s / n_steps))
    for epoch in range(cfg.epochs):
        order = list(range(len(examples)))
        rng.shuffle(order)
        for b in range(0, len(order), cfg.batch):
            x, rows, pos, tgt, wts = _batch(hidden, examples, full, order[b:b + cfg.batch], head_len, cfg.decision_weight)
            with torch.no_grad():
                _, pkv = model.top(xp, 0)
            h, _ = model.top(x, P, pkv)
            ce = F.cross_entropy(model.logits(h[rows, pos]), tgt, reduction="none")
            loss = (ce * wts).sum() / wts.sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            losses.append(round(loss.item(), 5))
            bar.update(1)
            bar.set_postfix(loss=f"{sum(losses[-20:]) / len(losses[-20:]):.4f}")


def save_adapter(model: LoraModel, cfg: JudgeTrainConfig, log: dict, out_dir: Path | None = None) -> Path:
    """adapter.json + adapter.safetensors + judge.json + train_log.json (+ manifest) in out_dir."""
    out = Path(out_dir or MODELS_DIR / cfg.name)
    out.mkdir(parents=True, exist_ok=True)
    tensors = model.adapter_tensors()
    targets = sorted({k.rpartition(".lora_")[0] for k in tensors})
    atomic_write(out / "adapter.safetensors", lambda tmp: save_file(tensors, tmp, metadata={"base": cfg.model}))
    _write_text(out / "adapter.json", json.dumps({"base": cfg.model, "rank": cfg.rank, "alpha": cfg.alpha,
                                                  "targets": targets}, indent=1) + "\n")
    _write_text(out / "judge.json", json.dumps({"prefix": judge_prefix(cfg.n_shots), "n_shots": cfg.n_shots,
                                                "item_template": ITEM_TEMPLATE}, indent=1) + "\n")
    _write_text(out / "train_log.json", json.dumps(log) + "\n")
    return out


def _write_text(path: Path, text: str) -> None:
    """Every file of a judge is written crash-safely (a reader sees the old file or the whole new one)."""
    atomic_write(path, text.encode("utf-8"))


def evaluate(name: str, items=None, progress: bool = True) -> dict:
    """Scores of trained judge `name` (on the engine) for every distinct item of the shipped stream, and
    their agreement with the intended labels."""
    t0 = time.perf_counter()
    judge = load_trained_judge(name)
    items = load_stream() if items is None else items
    texts = list(dict.fromkeys(it.text for it in items))
    scores = {t: round(judge.score(t), 5) for t in tqdm(texts, desc=f"{name}: shipped stream", disable=not progress)}
    return {"agreement": agreement(items, {t: s > judge.bias for t, s in scores.items()}), "scores": scores,
            "score_fingerprint": judge.score_fingerprint, "eval_s": round(time.perf_counter() - t0, 1), "judge": judge}


def record_evaluation(name: str, ev: dict) -> None:
    """eval.json next to the adapter, and the scores as lesson 5's recorded ground truth of this judge."""
    _write_text(MODELS_DIR / name / "eval.json", json.dumps({k: v for k, v in ev.items() if k not in ("scores", "judge")}) + "\n")
    write_ground_truth(ev["judge"], ev["scores"], answers_path(name), {"computed_with": "engine (lessonkit train judge)"})


def _rows(table: dict) -> str:
    return "\n".join(f"| {k} | {v['n']} | {100 * v['accuracy']:.1f}% |" for k, v in table.items())


def _data_options(cfg: JudgeTrainConfig) -> str:
    """The card's line on the data options a config turns on (empty when none)."""
    opts = (["the wide set of wordings (six more per family)"] if cfg.wide_phrasings and not cfg.grammar_phrasings else []) + \
        (["the wording grammar (20-57 wordings per family, none within four words of a shipped one)"]
         if cfg.grammar_phrasings else []) + \
        (["wide names (judge_data.WIDE_TRAIN_POOLS)"] if cfg.wide_entities else []) + \
        (["IPs in unused 10.x subnets too (judge_data.TEN_NET_IPS)"] if cfg.ten_net_ips else []) + \
        ([f"a hard negative is a unit change {cfg.unit_change_weight:g}x as often as another kind"]
         if cfg.unit_change_weight != 1 else [])
    return "\n- Data options: " + "; ".join(opts) + "." if opts else ""


def _machine_words(machine: dict | str) -> str:
    """The training log's machine (engine.machine.machine_record; a judge trained before it: the words already)."""
    return machine if isinstance(machine, str) else f"{machine['platform']} (torch {machine['torch']})"


def write_card(out: Path, cfg: JudgeTrainConfig, log: dict, ev: dict, ndjson: dict | None = None) -> Path:
    """card.md (data, time, accuracy per family / perturbation) and manifest.json of a trained judge."""
    a = ev["agreement"]
    c = a["confusion"]
    nd = "not measured" if not ndjson else (f"{ndjson['parsed']} of {ndjson['items']} answers parse and follow "
                                             f"JUDGE_SCHEMA ({ndjson['note']})")
    text = f"""# {cfg.name}: {cfg.model} trained as the monitoring judge

LoRA adapter (rank {cfg.rank}, alpha {cfg.alpha}) on {', '.join(cfg.targets)} of the last {cfg.n_top} layers of
{cfg.model}; the engine merges it into plain weights at load (`load_model("{cfg.name}")`).
Reproduce: `lessonkit train judge --model {cfg.model}` (seed {cfg.seed}, {cfg.threads} torch thread(s)).

## Data
- {log['train_items']} distinct training items from `lessonkit.training.judge_data` (monitoring generator,
  seed {TRAIN_STREAM.seed}, {cfg.n_originals} originals with paraphrases and hard negatives; own hosts,
  services, domains, databases, jobs, queues, IPs and phrasings; disjointness checked: {log['disjointness']['shared_items']}
  shared items, {log['disjointness']['shared_names']} shared names, {log['disjointness']['shared_phrasings']} shared phrasings).{_data_options(cfg)}
- Prompt: the triage instruction + {cfg.n_shots} training examples ({log['prefix_tokens']} tokens), then the item.
- Loss: the needs_action token of every example (weight {cfg.decision_weight}); the whole answer line for
  {log['full_answer_examples']} examples. {cfg.cycles} cycle(s) of {cfg.epochs} epochs (a fresh AdamW,
  lr {cfg.lr} with warm-up and linear decay, per cycle), batch {cfg.batch}.

## Time
{log['train_time_s'] / 60:.1f} min on {_machine_words(log['machine'])}, {cfg.threads} thread(s), shared 2-core machine
(frozen layers once: {log['cache_s']:.0f} s; cycles: {', '.join(f'{t:.0f} s' for t in log.get('cycle_s', []))}). Evaluation on the engine: {ev['eval_s']:.0f} s.

## Agreement with the intended labels of the shipped stream ({a['overall']['all']['n']} items)
Overall {100 * a['overall']['all']['accuracy']:.1f}% (tp {c['tp']}, fp {c['fp']}, fn {c['fn']}, tn {c['tn']}).
NDJSON: {nd}.

| perturbation | items | agreement |
|---|---|---|
{_rows(a['perturbation'])}

| relation | items | agreement |
|---|---|---|
{_rows(a['relation'])}

| family | items | agreement |
|---|---|---|
{_rows(a['family'])}
"""
    _write_text(out / "card.md", text)
    write_manifest(out, sorted(f.name for f in out.iterdir() if f.is_file() and f.name != "manifest.json"))
    return out / "card.md"


def train_judge(cfg: JudgeTrainConfig, progress: bool = True, ndjson: bool = True) -> dict:
    """Train, save, evaluate on the shipped stream and write the card; returns the summary.

    ndjson: also answer every distinct item in NDJSON (lessonkit.training.judge_ndjson.ndjson_answers) and count
    the answers for the card (their lines warm the capstone's semantic cache)."""
    model, log = train_adapter(cfg, progress)
    save_adapter(model, cfg, log)
    return finish_judge(cfg, log, progress, ndjson)


def finish_judge(cfg: JudgeTrainConfig, log: dict, progress: bool = True, ndjson: bool = True) -> dict:
    """Evaluate a saved adapter, record its scores and write its card."""
    ev = evaluate(cfg.name, progress=progress)
    nd = None
    if ndjson:
        nd = ndjson_answers(ev["judge"].engine, list(ev["scores"]), progress=progress)
        ev["ndjson"] = {k: v for k, v in nd.items() if k != "answers"}
        ev["ndjson"]["decision_agrees_with_score"] = sum(
            1 for t, a in nd["answers"].items() if (o := parse_answer(a)) is not None and o["needs_action"] == (ev["scores"][t] > 0))
    record_evaluation(cfg.name, ev)
    if nd is not None:        # the answer lines warm the capstone's semantic cache (lessonkit.stack warm_up)
        write_answer_lines(ev["judge"].engine, ev["judge"].prefix, nd["max_new_tokens"], nd["answers"])
    write_card(MODELS_DIR / cfg.name, cfg, log, ev, ev.get("ndjson"))
    return {"name": cfg.name, "dir": str(MODELS_DIR / cfg.name), "train_time_s": log["train_time_s"],
            "accuracy": ev["agreement"]["overall"]["all"]["accuracy"],
            "perturbation": {k: v["accuracy"] for k, v in ev["agreement"]["perturbation"].items()},
            "ndjson": ev.get("ndjson")}
