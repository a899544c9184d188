"""Training a feature head (lessonkit.feature_head) on its frozen target: self-distillation, training-time test.

1. The target pass (lessonkit.training.target_pass): the target's greedy answers to the TRAIN requests and
   teacher-forced corpus windows, with its states at the taps and the top and its greedy pick at every position, in
   shards on disk (a killed pass resumes; the missing shards may run on several processes, same bits).
2. The draft vocabulary: the `draft_vocab` tokens the target picks most often in that pass, every category weighing
   the same (choose_vocab).
3. The loop: AdamW over the head's weights (the target's embedding, final norm and output rows are frozen), each
   batch through `ttt_steps` chained steps (head.layer_steps): step 1 from the target's states, step s from the
   head's own step s - 1 outputs. Loss per step: cross-entropy on the target's greedy pick over the draft
   vocabulary (positions whose pick lies outside it are left out), plus `reg_weight` x smooth L1 between the
   normalised output and the target's normalised top state. A checkpoint (weights, optimiser, step, data order's
   generator) is written atomically every `checkpoint_every` steps; a killed run resumes from it and ends with the
   same bits as a run left alone (one thread: tests/test_feature_head.py).
"""
from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from tqdm.auto import tqdm

from lessonkit.engine import kernel
from lessonkit.engine.machine import cpu_name
from lessonkit.engine.model import rms_norm
from lessonkit.errors import LessonkitError
from lessonkit.feature_head import head as fh
from lessonkit.files.atomic import atomic_write
from lessonkit.training.target_pass import pass_dir, pass_inputs, target_pass


@dataclass(frozen=True)
class HeadTrainConfig:
    per_category: int = 450           # TRAIN requests per category
    max_new_tokens: int = 128
    text_windows: int = 400           # teacher-forced windows of the corpus' train split per kind of text
    window: int = 128
    draft_vocab: int = 3072
    intermediate_size: int | None = None   # the head's MLP (None: the target's)
    epochs: int = 3
    batch_size: int = 8
    lr: float = 1e-3
    warmup: int = 40
    ttt_steps: int = 3
    step_weights: tuple = (1.0, 0.7, 0.5)
    reg_weight: float = 0.2
    seed: int = 0
    checkpoint_every: int = 50
    continuations: int = 0            # per kind of text: the target's greedy continuations of train-split openings
                                      # (a model of the corpus, not of requests: tiny-moe)
    weights: str | None = None        # the target's weights for the pass (load_model's weights=), as the benches load it

    def data_key(self) -> dict:
        """What the target pass depends on (its shards' folder is keyed by it): the requests, the continuations,
        then the windows."""
        return {"per_category": self.per_category, "max_new_tokens": self.max_new_tokens, "seed": self.seed,
                **({"continuations": self.continuations} if self.continuations else {}),
                **({"weights": self.weights} if self.weights else {}),
                **({"text_windows": self.text_windows, "window": self.window} if self.text_windows else {})}

    def settings(self) -> dict:
        """Every field, continuations only where set (so the keys of presets without them stay as they were)."""
        d = {**asdict(self), "step_weights": list(self.step_weights)}
        for name in ("continuations", "weights"):
            if not d[name]:
                d.pop(name)
        return d


PRESETS = {
    "smollm2-135m": HeadTrainConfig(epochs=5),         # on 2 threads: the pass and the loop inside 60 minutes
    "tiny-moe": HeadTrainConfig(per_category=0, continuations=400, max_new_tokens=96, text_windows=600, draft_vocab=1024,
                                weights="q8_0"),
    "test": HeadTrainConfig(per_category=2, max_new_tokens=6, text_windows=1, window=16, draft_vocab=64, intermediate_size=64, epochs=2,
                            batch_size=2, warmup=2, checkpoint_every=2),
}


# ----------------------------------------------------------------------------- 2. the draft vocabulary
def choose_vocab(seqs: list[dict], n: int, vocab_size: int) -> torch.Tensor:
    """The n tokens the target picks most often in its answers, each category weighing the same (a token's score:
    the sum over categories of its share of that category's picks), so the corpus windows, most of the positions,
    do not crowd out the chat answers' words; highest score first, ties: lower id."""
    score = torch.zeros(vocab_size, dtype=torch.float64)
    for cat in sorted({s["category"] for s in seqs}):
        counts = torch.zeros(vocab_size, dtype=torch.float64)
        for s in seqs:
            if s["category"] == cat:
                counts += torch.bincount(s["picks"][s["prompt_len"] - 1:], minlength=vocab_size).double()
        score += counts / counts.sum().clamp(min=1)
    return torch.sort(-score, stable=True).indices[:n].clone()


def coverage(seqs: list[dict], vocab: torch.Tensor, answers_only: bool = True) -> dict:
    """Share of the target's greedy picks that lie in the vocabulary, per category (answers: after the prompt)."""
    inside = torch.zeros(max(int(vocab.max()) + 1, max(int(s["picks"].max()) for s in seqs) + 1), dtype=torch.bool)
    inside[vocab] = True
    out = {}
    for cat in sorted({s["category"] for s in seqs}):
        picks = torch.cat([s["picks"][s["prompt_len"] - 1 if answers_only else 0:] for s in seqs if s["category"] == cat])
        out[cat] = float(inside[picks].float().mean())
    return out


# ----------------------------------------------------------------------------- 3. the loop
@dataclass
class Frozen:
    embed: torch.Tensor       # [V_target, D] float32
    norm: torch.Tensor        # [D]
    rows: torch.Tensor        # [draft_vocab, D] the target's output rows of the vocabulary
    cos: torch.Tensor
    sin: torch.Tensor

    @classmethod
    def of(cls, target, vocab: torch.Tensor) -> "Frozen":
        m = target.model
        embed = m.float_weight("embed").float()
        lm = embed if target.config.tie_embeddings else m.float_weight("lm_head").float()
        return cls(embed, m.float_weight("norm").float(), lm[vocab].clone(), m.cos, m.sin)


def _batch(seqs: list[dict], idx: list[int], index_of: torch.Tensor):
    """Padded tensors of a batch: states [B, T, S, D], tokens [B, T + 1], labels [B, T] (draft-vocabulary index
    of the target's pick, -1: outside it or padding), tops [B, T, D] of the position after each row."""
    T = max(len(seqs[i]["picks"]) for i in idx)
    B, S, D = len(idx), seqs[idx[0]]["states"].shape[1], seqs[idx[0]]["states"].shape[2]
    states = torch.zeros(B, T, S, D)
    tokens = torch.zeros(B, T + 1, dtype=torch.long)
    labels = torch.full((B, T), -1, dtype=torch.long)
    for b, i in enumerate(idx):
        s = seqs[i]
        n = len(s["picks"])
        states[b, :n] = s["states"].float()
        tokens[b, :n + 1] = s["tokens"][:n + 1]
        labels[b, :n] = index_of[s["picks"]]
    return states, tokens, labels


def losses(w: dict, cfg: fh.HeadConfig, fz: Frozen, states, tokens, labels, tc: HeadTrainConfig):
    """Per step (cross-entropy, accuracy) on rows r (head row p = r + 1: state r, token r + 1, label = the
    target's pick after position r + 1) and the total loss."""
    B, T = labels.shape
    g = fh.fuse(w, cfg, states)                                      # [B, T, D]: fused state of position r
    e = fz.embed[tokens[:, 1:T + 1]]                                  # token of position r + 1
    y = labels[:, 1:]                                                 # pick after position r + 1, rows 0 .. T - 2
    top_next = states[:, 1:, -1]                                      # the target's top state at r + 1
    cos, sin = fz.cos[:T], fz.sin[:T]
    qkv, u, outs = [], g, []
    for s in range(tc.ttt_steps):
        outs.append(fh.layer_step(w, cfg, qkv, fh.head_input(w, cfg, e, u), cos, sin))
        u = torch.cat([torch.zeros_like(outs[-1][:, :1]), outs[-1][:, :-1]], 1)   # row r gets step s's row r - 1
    total, per_step = 0.0, []
    for s, a in enumerate(outs):
        a = a[:, :T - 1]
        valid = y >= 0
        valid[:, :s] = False                                          # a row of step s + 1 needs s rows before it
        logits = fh.draft_logits(a, fz.norm, fz.rows, cfg.norm_eps)
        ce = F.cross_entropy(logits[valid], y[valid]) if valid.any() else logits.sum() * 0
        reg = F.smooth_l1_loss(rms_norm(a, fz.norm, cfg.norm_eps)[valid],
                               rms_norm(top_next, fz.norm, cfg.norm_eps)[valid]) if valid.any() else ce * 0
        total = total + tc.step_weights[s] * (ce + tc.reg_weight * reg)
        acc = float((logits[valid].argmax(-1) == y[valid]).float().mean()) if valid.any() else 0.0
        per_step.append((ce.item(), acc))
    return total, per_step


def _lr(tc: HeadTrainConfig, step: int, total: int) -> float:
    if step < tc.warmup:
        return tc.lr * (step + 1) / tc.warmup
    return tc.lr * 0.5 * (1 + math.cos(math.pi * (step - tc.warmup) / max(1, total - tc.warmup)))


def _order(n: int, epochs: int, batch: int, seed: int, seqs: list[dict]) -> list[list[int]]:
    """Batches of similar lengths, shuffled per epoch with a seeded generator: one fixed list for the run."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(epochs):
        perm = torch.randperm(n, generator=g).tolist()
        chunks = [perm[i:i + batch * 8] for i in range(0, n, batch * 8)]
        for c in chunks:
            c = sorted(c, key=lambda i: len(seqs[i]["picks"]))
            bs = [c[i:i + batch] for i in range(0, len(c), batch)]
            out += [bs[j] for j in torch.randperm(len(bs), generator=g).tolist()]
    return out


def train(target, tc: HeadTrainConfig, out_dir: Path, progress: bool = True, stop_after: int | None = None,
          workers: int = 1) -> dict:
    """Train (or resume) the head for `target`; writes out_dir/{head.safetensors, train_log.json, card.md}.
    stop_after: stop (as if killed) after that many steps, leaving only the checkpoint. workers: processes for the
    target pass's missing shards (the same bits on any count)."""
    t0 = time.perf_counter()
    out_dir = Path(out_dir)
    cfg0 = fh.config_for(target, draft_vocab=tc.draft_vocab, intermediate_size=tc.intermediate_size)
    inputs = pass_inputs(target, tc)
    seqs = target_pass(target, tc, cfg0.taps, progress, inputs, workers)
    t_pass = time.perf_counter() - t0
    vocab = choose_vocab(seqs, tc.draft_vocab, target.config.vocab_size)
    index_of = torch.full((target.config.vocab_size,), -1, dtype=torch.long)
    index_of[vocab] = torch.arange(len(vocab))
    fz = Frozen.of(target, vocab)
    w = fh.init_params(cfg0, vocab, tc.seed)
    params = {k: v.requires_grad_() for k, v in w.items() if k != "vocab"}
    opt = torch.optim.AdamW(params.values(), lr=tc.lr, weight_decay=0.0)
    order = _order(len(seqs), tc.epochs, tc.batch_size, tc.seed, seqs)
    ckpt = pass_dir(target, tc, cfg0.taps, inputs) / f"checkpoint-{_train_key(tc)}.pt"
    step, log, spent = _resume(ckpt, params, opt)
    t1 = time.perf_counter()
    bar = tqdm(total=len(order), initial=step, desc="training the feature head", disable=not progress)
    while step < len(order):
        for gr in opt.param_groups:
            gr["lr"] = _lr(tc, step, len(order))
        states, tokens, labels = _batch(seqs, order[step], index_of)
        loss, per_step = losses(w, cfg0, fz, states, tokens, labels, tc)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params.values(), 1.0)
        opt.step()
        step += 1
        log.append([step, loss.item()] + [x for ps in per_step for x in ps])
        bar.update(1)
        bar.set_postfix(loss=f"{log[-1][1]:.3f}", acc1=f"{per_step[0][1]:.2f}")
        if step % tc.checkpoint_every == 0 or step == len(order):
            snap = {"params": {k: v.detach().clone() for k, v in params.items()}, "opt": opt.state_dict(),
                    "step": step, "log": log, "train_s": spent + time.perf_counter() - t1,
                    "threads": torch.get_num_threads()}
            atomic_write(ckpt, lambda tmp: torch.save(snap, tmp))
        if stop_after is not None and step >= stop_after and step < len(order):
            bar.close()
            return {"stopped_at": step}
    bar.close()
    final = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in params.items()} | {"vocab": vocab}
    info = {"target": target.name, "target_fingerprint": target.fingerprint(), "numerics": kernel.NUMERICS,
            "config": cfg0.to_dict(), "train": tc.settings(),
            "requests": len(seqs), "positions": int(sum(len(s["picks"]) for s in seqs)),
            "coverage": coverage(seqs, vocab), "pass_s": round(t_pass, 1), "pass_workers": workers,
            "train_s": round(spent + time.perf_counter() - t1, 1), "steps": step,
            "threads": torch.get_num_threads(), "cpu": cpu_name(), "date": time.strftime("%Y-%m-%d"),
            "log_every_10": log[::10] + [log[-1]]}
    save_head(out_dir, final, info)
    return info


def _resume(ckpt: Path, params: dict, opt) -> tuple[int, list, float]:
    """(step, log, training seconds so far) from the checkpoint, its weights and optimiser state loaded; a fresh
    start without one. A checkpoint written on another torch thread count is refused: a step's bits may depend on
    it (a sum split over threads), so the resumed head would be neither count's."""
    if not ckpt.exists():
        return 0, [], 0.0
    try:
        st = torch.load(ckpt, weights_only=True)
    except Exception as e:
        raise LessonkitError(f"{ckpt}: unreadable training checkpoint ({e}); delete it to start over") from None
    written_on, now = (st.get("threads") if isinstance(st, dict) else None), torch.get_num_threads()
    if written_on not in (None, now):
        raise LessonkitError(f"{ckpt}: a training checkpoint written on {written_on} torch thread(s), resumed on "
                             f"{now}; resume with --threads {written_on}, or delete it to start over")
    try:
        with torch.no_grad():
            for k, v in st["params"].items():
                params[k].copy_(v)
        opt.load_state_dict(st["opt"])
        return st["step"], st["log"], float(st.get("train_s", 0.0))
    except Exception as e:
        raise LessonkitError(f"{ckpt}: unreadable training checkpoint ({e}); delete it to start over") from None


def _train_key(tc: HeadTrainConfig) -> str:
    return hashlib.sha256(json.dumps(tc.settings(), sort_keys=True).encode()).hexdigest()[:10]


def save_head(out_dir: Path, w: dict, info: dict) -> None:
    """head.safetensors (weights, the draft vocabulary, what it was made for in the metadata), train_log.json."""
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = {"format": "lessonkit-feature-head-v1", "target": info["target"],
            "target_fingerprint": info["target_fingerprint"], "numerics": info["numerics"],
            "config": json.dumps(info["config"])}
    atomic_write(out_dir / "head.safetensors", lambda tmp: save_file(w, str(tmp), metadata=meta))
    atomic_write(out_dir / "train_log.json", json.dumps(info, indent=1).encode())

