"""Distillation data from a frozen target: what the target itself says, for drafters to learn.

DistillSpec (Zhou et al. 2023) and the self-distillation of Medusa-2 / EAGLE train a drafter on its
target's own predictions instead of the corpus text, because a draft is accepted when it agrees
with the target, not when it agrees with the text. One teacher pass gives every drafter its data:

  text rows     windows of corpus text, teacher-forced in one batched prefill;
  greedy rows   a short corpus prompt followed by the target's own greedy continuation (batched
                decoding with a KV cache), the regime a drafter meets while drafting.

For every position of every row the pass keeps the target's top-k next-token probabilities and ids
(k = 16 by default: small, and the mass beyond it hardly changes which token a drafter ranks
first) and, on request, the target's last hidden state (the input of its final norm), which the MTP
head needs. All rows have the same length, so no padding enters the teacher's numerics.

The teacher is the transformers model exported from the engine's weights (batched prefill and
decoding are far faster there than one sequence at a time). The pass is seeded and deterministic
for a given torch version and thread count, and cached under $LESSONKIT_HOME/distill/, keyed by the
target's fingerprint and the configuration.

Shapes: N rows, T positions per row, K top-k, D hidden size, V vocabulary.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from lessonkit.files.atomic import atomic_write
from lessonkit.models.convert import export_hf
from lessonkit.errors import LessonkitError
from lessonkit.files.resources import lessonkit_home
from lessonkit.models.registry import load_model
from lessonkit.workloads.corpus import EOT, KINDS, load_documents, spread_slots


@dataclass(frozen=True)
class DistillConfig:
    text_rows: int = 96              # teacher-forced corpus windows per kind of text
    greedy_rows: int = 96            # greedy continuations per kind of text
    prompt_len: int = 32             # corpus tokens before a greedy continuation
    seq_len: int = 96                # tokens per row (text windows and prompt + continuation)
    top_k: int = 16
    batch_size: int = 16
    keep_hidden: bool = False        # also keep the target's last hidden states (bfloat16), for MTP heads
    split: str = "train"
    seed: int = 0
    spread: bool = False             # windows and prompts from the whole split (seeded), not from its first tokens


PRESETS = {
    "tiny-moe": DistillConfig(text_rows=480, greedy_rows=480, batch_size=32, keep_hidden=True),
    "smollm2-135m": DistillConfig(text_rows=64, greedy_rows=128, batch_size=16, keep_hidden=True),
    # the smollm2 MTP head's: 2.7x the tokens, mostly teacher-forced corpus text (a head trained on 55,296
    # tokens reached 0.9 batch accuracy against ~0.45 held out: it was learning its data by heart)
    "smollm2-135m-mtp": DistillConfig(text_rows=320, greedy_rows=192, batch_size=16, keep_hidden=True),
    # the same sizes drawn from the whole train split: the 'mtp' pass reads only its first ~49k tokens per kind,
    # and a drafter trained on it agrees with the target less beyond them (docs/speculative.md)
    "smollm2-135m-spread": DistillConfig(text_rows=320, greedy_rows=192, batch_size=16, keep_hidden=True, spread=True),
    "test": DistillConfig(text_rows=2, greedy_rows=2, prompt_len=8, seq_len=24, top_k=4, batch_size=2,
                          keep_hidden=True),
}


def heldout(cfg: DistillConfig, rows: int = 16) -> DistillConfig:
    """The same pass over the corpus' held-out split, `rows` rows of each sort per kind."""
    return replace(cfg, text_rows=rows, greedy_rows=rows, split="heldout", seed=cfg.seed + 1)


@dataclass
class DistillData:
    tokens: torch.Tensor             # [N, T] long
    topk_ids: torch.Tensor           # [N, T, K] int32: the target's top-k picks for the token after t
    topk_probs: torch.Tensor         # [N, T, K] float16: their probabilities (full-vocabulary softmax)
    hidden: torch.Tensor | None      # [N, T, D] bfloat16 or None
    kinds: list[str]                 # per row: prose / code / records
    sources: list[str]               # per row: "text" or "greedy"

    @property
    def greedy(self) -> torch.Tensor:
        """[N, T] the target's greedy pick for the token after each position."""
        return self.topk_ids[..., 0].long()

    def rows(self, kind: str | None = None, source: str | None = None) -> torch.Tensor:
        """Indices of the rows of one kind and/or source."""
        keep = [i for i, (k, s) in enumerate(zip(self.kinds, self.sources))
                if (kind is None or k == kind) and (source is None or s == source)]
        return torch.tensor(keep, dtype=torch.long)

    def to_dict(self) -> dict:
        return {"tokens": self.tokens, "topk_ids": self.topk_ids, "topk_probs": self.topk_probs,
                "hidden": self.hidden, "kinds": self.kinds, "sources": self.sources}


# ----------------------------------------------------------------------------- loss
def distill_loss(logits: torch.Tensor, topk_ids: torch.Tensor, topk_probs: torch.Tensor,
                 hard_weight: float = 0.5, has_pick: torch.Tensor | None = None) -> torch.Tensor:
    """Cross-entropy of the student's logits [..., V] against the target's top-k distribution
    (renormalised over its k ids), plus `hard_weight` x cross-entropy against the target's greedy pick.

    The soft part is KL(target_topk || student) up to a constant; the hard part weights what
    greedy acceptance counts: the target's first choice. has_pick [...] (bool): the positions whose
    greedy pick the student can output at all (a reduced output layer); the hard part averages over those."""
    logp = F.log_softmax(logits.float(), dim=-1)
    ids = topk_ids.long()
    p = topk_probs.float()
    p = p / p.sum(-1, keepdim=True).clamp_min(1e-12)
    soft = -(p * logp.gather(-1, ids)).sum(-1).mean()
    if has_pick is None:
        hard = -logp.gather(-1, ids[..., :1]).mean()
    else:
        w = has_pick.float()
        hard = -(logp.gather(-1, ids[..., :1]).squeeze(-1) * w).sum() / w.sum().clamp_min(1.0)
    return soft + hard_weight * hard


# ----------------------------------------------------------------------------- teacher
def teacher_model(engine):
    """The target as a transformers model on the engine's own weights (exported once, cached)."""
    import transformers
    out = lessonkit_home() / "hf-export" / f"{engine.name}-{engine.fingerprint()[:12]}"
    if not (out / "config.json").exists():
        export_hf(engine.model_dir, out)
    m = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    return m.eval()


def _stream(engine, kind: str, split: str, need: int | None) -> list[int]:
    """The split's documents as one token stream, its first `need` tokens or more (None: all of it)."""
    ids: list[int] = []
    for d in load_documents(kind, split):
        if d.strip():
            ids.extend(engine.encode(d + EOT))
        if need is not None and len(ids) >= need:
            break
    return ids


def _line_starts(engine, ids: list[int], prompt_len: int) -> list[int]:
    """Positions that follow a token containing a line break (each distinct token decoded once)."""
    breaks = {t: "\n" in engine.decode([t]) for t in set(ids)}
    return [i + 1 for i, t in enumerate(ids[:-prompt_len - 1]) if breaks[t]]


def _window_starts(n_slots: int, n: int, cfg: DistillConfig, kind: str) -> list[int]:
    """Window slots: the first n, or with cfg.spread n seeded distinct slots from the whole stream, in order."""
    if not cfg.spread:
        return list(range(n))
    return spread_slots(n_slots, n, 10_000 + cfg.seed + (KINDS.index(kind) if kind in KINDS else 0))


def corpus_rows(engine, kind: str, cfg: DistillConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(text windows [text_rows, seq_len], prompts [greedy_rows, prompt_len]) of one kind, seeded:
    text windows are consecutive from the split's start (cfg.spread: seeded slots over the whole split);
    prompts start at seeded positions that follow a line break."""
    need = None if cfg.spread else (cfg.text_rows + cfg.greedy_rows + 2) * cfg.seq_len
    ids = _stream(engine, kind, cfg.split, need)
    n_slots = len(ids) // cfg.seq_len - 1
    n_text = min(cfg.text_rows, n_slots)
    if n_text < 1 and cfg.text_rows:
        raise LessonkitError(f"corpus {kind}.{cfg.split}: too few tokens for one window of {cfg.seq_len}")
    starts = _window_starts(n_slots, n_text, cfg, kind)
    text = torch.tensor([ids[s * cfg.seq_len: (s + 1) * cfg.seq_len] for s in starts],
                        dtype=torch.long).view(n_text, cfg.seq_len)
    nl = _line_starts(engine, ids, cfg.prompt_len)
    if len(nl) < 1:
        nl = list(range(len(ids) - cfg.prompt_len))
    g = torch.Generator().manual_seed(cfg.seed + KINDS.index(kind) if kind in KINDS else cfg.seed)
    starts = torch.randint(0, len(nl), (cfg.greedy_rows,), generator=g).tolist()
    prompts = torch.tensor([ids[nl[s]: nl[s] + cfg.prompt_len] for s in starts], dtype=torch.long)
    return text, prompts.view(cfg.greedy_rows, cfg.prompt_len)


def _top(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    p, i = torch.softmax(logits.float(), dim=-1).topk(k, dim=-1)
    return i.to(torch.int32), p.to(torch.float16)


@torch.no_grad()
def teacher_pass(model, prompts: torch.Tensor, new_tokens: int, k: int, keep_hidden: bool) -> tuple:
    """Batched prefill of prompts [B, P], then `new_tokens` greedy steps with the KV cache.

    Returns (tokens [B, P + n], top-k ids and probs [B, P + n, k], hidden [B, P + n, D] or None):
    the target's top-k for the token after every position, including the last one fed."""
    hid: list[torch.Tensor] = []
    hook = model.model.norm.register_forward_hook(lambda mod, inp, out: hid.append(inp[0].to(torch.bfloat16)))
    try:
        out = model(input_ids=prompts, use_cache=True)
        tops, toks = [_top(out.logits, k)], [prompts]
        for _ in range(new_tokens):
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            toks.append(nxt)
            out = model(input_ids=nxt, cache=out.cache, use_cache=True)
            tops.append(_top(out.logits, k))
    finally:
        hook.remove()
    ids, probs = (torch.cat([t[j] for t in tops], dim=1) for j in (0, 1))
    return torch.cat(toks, dim=1), ids, probs, (torch.cat(hid, dim=1) if keep_hidden else None)


def _batched(model, rows: torch.Tensor, new_tokens: int, cfg: DistillConfig, bar) -> list[tuple]:
    parts = []
    for i in range(0, len(rows), cfg.batch_size):
        parts.append(teacher_pass(model, rows[i: i + cfg.batch_size], new_tokens, cfg.top_k, cfg.keep_hidden))
        bar.update(len(rows[i: i + cfg.batch_size]))
    return parts


def build(engine, cfg: DistillConfig, progress: bool = True) -> DistillData:
    """Run the teacher over text windows and greedy continuations of every kind of text."""
    torch.manual_seed(cfg.seed)
    model = teacher_model(engine)
    jobs = [(kind, *corpus_rows(engine, kind, cfg)) for kind in KINDS]
    total = sum(len(t) + len(p) for _, t, p in jobs)
    parts, kinds, sources = [], [], []
    with tqdm(total=total, desc=f"teacher pass {engine.name} ({cfg.split})", disable=not progress) as bar:
        for kind, text, prompts in jobs:
            for rows, new, src in ((text, 0, "text"), (prompts, cfg.seq_len - cfg.prompt_len, "greedy")):
                got = _batched(model, rows, new, cfg, bar)
                parts += got
                kinds += [kind] * len(rows)
                sources += [src] * len(rows)
    cat = lambda j: torch.cat([p[j] for p in parts]) if parts else None   # noqa: E731
    return DistillData(cat(0), cat(1), cat(2), cat(3) if cfg.keep_hidden else None, kinds, sources)


def cache_path(engine, cfg: DistillConfig) -> Path:
    fields = asdict(cfg)
    if not cfg.spread:                 # passes cached before the option existed keep their key
        del fields["spread"]
    key = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]
    return lessonkit_home() / "distill" / f"{engine.name}-{engine.fingerprint()[:16]}-{key}.pt"


def distill_data(target, cfg: DistillConfig | str = "tiny-moe", progress: bool = True) -> DistillData:
    """The teacher pass for `target` (an engine or a model name), from the cache when present."""
    engine = load_model(target) if isinstance(target, str) else target
    if isinstance(cfg, str):
        if cfg not in PRESETS:
            raise LessonkitError(f"unknown distillation preset {cfg!r}: known {', '.join(PRESETS)}")
        cfg = PRESETS[cfg]
    f = cache_path(engine, cfg)
    if f.exists():
        try:
            return DistillData(**torch.load(f, weights_only=True))
        except Exception as e:
            raise LessonkitError(f"{f}: unreadable distillation cache ({e}); delete it to recompute") from None
    data = build(engine, cfg, progress)
    f.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(f, lambda tmp: torch.save(data.to_dict(), tmp))
    return data


def agreement(pred: torch.Tensor, data: DistillData) -> dict:
    """Share of positions where `pred` [N, T] equals the target's greedy pick, per kind and source."""
    out = {}
    for src in ("text", "greedy"):
        for kind in KINDS:
            idx = data.rows(kind, src)
            if len(idx):
                out[f"{src}/{kind}"] = float((pred[idx] == data.greedy[idx]).float().mean())
    return out


@torch.no_grad()
def student_agreement(model, held: DistillData, batch: int = 16) -> dict:
    """Greedy agreement of a transformers student with the target on a (held-out) teacher pass."""
    was = model.training
    model.eval()
    pred = torch.cat([model(input_ids=held.tokens[i:i + batch]).logits.argmax(-1)
                      for i in range(0, len(held.tokens), batch)])
    model.train(was)
    return agreement(pred, held)
