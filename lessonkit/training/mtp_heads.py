"""Training an MTP head on a frozen target, and the model card that ships with it.

Data: the corpus' train split, tokenised by the target, target hidden states precomputed once.
Loss per row t: CE(head logits, target greedy pick for t+2) on `ce_rows` rows + reg_weight *
smoothL1(RMSNorm_final(y_t), RMSNorm_final(h_{t+1})), the target's own state one position on.
Deterministic on CPU for a given seed and thread count.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from lessonkit.files.atomic import atomic_write
from lessonkit.engine.model import rms_norm
from lessonkit.mtp.evaluate import (HELDOUT_SAMPLE, TargetStates, acceptance_by_kind, cached_states, eval_windows,
                                    heldout_sample)
from lessonkit.mtp.head import (NORMS, REAL_SCALE_RATIO, MtpConfig, MtpHead, Shared, block, eh_scale_ratio, init_head,
                                mtp_input, rescale_embedding_half)
from lessonkit.workloads.corpus import KINDS
from lessonkit.training.distill import PRESETS as DISTILL_PRESETS
from lessonkit.training.distill import distill_data, distill_loss, heldout

@dataclass(frozen=True)
class TrainMtpConfig:
    intermediate_size: int = 512
    windows_per_kind: int = 120      # training windows of seq_len tokens per kind of text
    seq_len: int = 256
    steps: int = 600
    batch_size: int = 8
    lr: float = 2e-3
    warmup: int = 30
    weight_decay: float = 0.0
    ce_rows: int | None = None       # rows per batch that get the full-vocabulary cross-entropy (None = all)
    reg_weight: float = 1.0          # weight of the hidden-state regression (smooth L1 on normed states)
    eval_every: int = 100
    seed: int = 0
    real_scale_ratio: float | None = REAL_SCALE_RATIO   # documented rescaling of eh_proj's halves (see card)
    distill_preset: str | None = None  # train on this teacher pass (workloads.distill) instead of corpus windows
    hard_weight: float = 0.5         # with distill_preset: weight of the greedy pick next to the top-k distribution


PRESETS = {
    "tiny-moe": TrainMtpConfig(windows_per_kind=60, steps=400, batch_size=4, ce_rows=256, eval_every=80),
    "smollm2-135m": TrainMtpConfig(intermediate_size=384, steps=6000, batch_size=8, lr=2e-3, ce_rows=96,
                                   eval_every=250, distill_preset="smollm2-135m-mtp"),
    "test": TrainMtpConfig(intermediate_size=64, windows_per_kind=2, seq_len=64, steps=30, batch_size=2,
                           eval_every=10, real_scale_ratio=None),
}


def _training_states(engine, tc: TrainMtpConfig, progress: bool) -> tuple[TargetStates, tuple | None]:
    """(the target's states, its top-k (ids, probs) or None): from the teacher pass `tc.distill_preset`
    (corpus windows and the target's greedy continuations), else over `windows_per_kind` corpus windows."""
    if tc.distill_preset:
        d = distill_data(engine, tc.distill_preset, progress)
        return TargetStates(d.tokens, d.hidden.float(), d.greedy), (d.topk_ids, d.topk_probs)
    parts = [cached_states(engine, k, "train", tc.windows_per_kind, tc.seq_len, progress) for k in KINDS]
    return TargetStates(*(torch.cat([getattr(p, f) for p in parts]) for f in ("tokens", "hidden", "greedy"))), None


def distill_eval_states(engine, tc: TrainMtpConfig, progress: bool = True) -> dict:
    """Held-out teacher-pass states per 'source/kind' (text windows, greedy continuations)."""
    d = distill_data(engine, heldout(DISTILL_PRESETS[tc.distill_preset]), progress)
    return {f"{src}/{kind}": TargetStates(d.tokens[i], d.hidden[i].float(), d.greedy[i])
            for src in ("text", "greedy") for kind in KINDS if len(i := d.rows(kind, src))}


def _optimizer(params: dict, tc: TrainMtpConfig) -> torch.optim.AdamW:
    decay = [p for k, p in params.items() if k not in NORMS]
    return torch.optim.AdamW([{"params": decay, "weight_decay": tc.weight_decay},
                              {"params": [params[k] for k in NORMS], "weight_decay": 0.0}], lr=tc.lr, betas=(0.9, 0.95))


def _lr(tc: TrainMtpConfig, step: int) -> float:
    """Linear warm-up, then cosine down to 0.1 x lr."""
    return tc.lr * min(1.0, (step + 1) / tc.warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / tc.steps)))


def _losses(params: dict, cfg: MtpConfig, sh: Shared, states: TargetStates, target_n: torch.Tensor, pos: torch.Tensor,
            idx: torch.Tensor, g: torch.Generator, tc: TrainMtpConfig, soft: tuple | None = None):
    """(loss, cross-entropy, regression, batch accuracy) of the windows `idx`."""
    tok, hid = states.tokens[idx], states.hidden[idx]
    x = mtp_input(params, cfg, hid[:, :-1], sh.embed[tok[:, 1:]])
    y, _, _ = block(params, cfg, sh, x, pos)
    yn = rms_norm(y, sh.norm, sh.eps)
    reg = F.smooth_l1_loss(yn, target_n[idx, 1:])
    lab = states.greedy[idx, 1:].reshape(-1)
    flat = yn.reshape(-1, cfg.dim)
    sel = torch.arange(flat.shape[0])
    if tc.ce_rows is not None and tc.ce_rows < flat.shape[0]:
        sel = torch.randperm(flat.shape[0], generator=g)[:tc.ce_rows]
    flat, lab = flat[sel], lab[sel]
    logits = F.linear(flat, sh.lm_head)
    if soft is None:
        ce = F.cross_entropy(logits, lab)
    else:
        ids, probs = (t[idx, 1:].reshape(-1, t.shape[-1])[sel] for t in soft)
        ce = distill_loss(logits, ids, probs, tc.hard_weight)
    return ce + tc.reg_weight * reg, ce, reg, logits.argmax(-1) == lab


def _shipped_head(engine, cfg: MtpConfig, params: dict, tc: TrainMtpConfig, states: TargetStates, t_states: float,
                  t0: float) -> MtpHead:
    """The trained head with the documented rescaling of eh_proj (see the card) and its metadata."""
    head = MtpHead(cfg, {k: v.detach().clone() for k, v in params.items()})
    natural = eh_scale_ratio(head)
    factor = 1.0
    if tc.real_scale_ratio is not None:
        factor = tc.real_scale_ratio / natural
        head = rescale_embedding_half(head, factor)
    head.meta = {"target": engine.name, "target_dims": {"dim": cfg.dim, "vocab_size": cfg.vocab_size},
                 "train": asdict(tc), "trained_steps": tc.steps, "train_tokens": int(states.tokens.numel()),
                 "natural_scale_ratio": natural, "rescale_factor": factor, "scale_ratio": eh_scale_ratio(head),
                 "seconds_states": t_states, "seconds_total": time.perf_counter() - t0,
                 "torch_threads": torch.get_num_threads()}
    return head


def train_head(engine, tc: TrainMtpConfig = TrainMtpConfig(), progress: bool = True, states: dict | None = None,
               eval_states: dict | None = None) -> tuple[MtpHead, dict]:
    """Train an MTP head on the frozen target; returns (head, log of losses and held-out acceptance)."""
    torch.manual_seed(tc.seed)
    t0 = time.perf_counter()
    soft = None
    if states is None:
        states, soft = _training_states(engine, tc, progress)
    if eval_states is None:
        eval_states = (distill_eval_states(engine, tc, progress) if tc.distill_preset
                       else eval_windows(engine, 2, 128, progress=progress))
    t_states = time.perf_counter() - t0
    cfg = MtpConfig.from_target(engine.config, tc.intermediate_size)
    sh = Shared.from_engine(engine)
    params = {k: torch.nn.Parameter(v) for k, v in init_head(cfg, tc.seed).items()}
    opt = _optimizer(params, tc)
    g = torch.Generator().manual_seed(tc.seed)
    N, T = states.tokens.shape
    pos = torch.arange(T - 1)
    target_n = rms_norm(states.hidden, sh.norm, sh.eps)          # [N, T, D] what the head's output should become
    log = {"step": [], "loss": [], "ce": [], "reg": [], "batch_acc": [], "eval_step": [], "eval_acceptance": []}
    bar = tqdm(range(tc.steps), desc="train MTP head", disable=not progress)
    for step in bar:
        for grp in opt.param_groups:
            grp["lr"] = _lr(tc, step)
        idx = torch.randint(0, N, (tc.batch_size,), generator=g)
        loss, ce, reg, hits = _losses(params, cfg, sh, states, target_n, pos, idx, g, tc, soft)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
        opt.step()
        acc = float(hits.float().mean())
        for k_, v_ in (("step", step), ("loss", loss.item()), ("ce", ce.item()), ("reg", reg.item()), ("batch_acc", acc)):
            log[k_].append(v_)
        bar.set_postfix(loss=f"{loss.item():.3f}", acc=f"{acc:.2f}")
        if (step + 1) % tc.eval_every == 0 or step + 1 == tc.steps:
            ev = acceptance_by_kind(MtpHead(cfg, {k: v.detach() for k, v in params.items()}), sh, eval_states, depth=1)
            log["eval_step"].append(step + 1)
            log["eval_acceptance"].append({k: v["acceptance"][0] for k, v in ev.items()})
    head = _shipped_head(engine, cfg, params, tc, states, t_states, t0)
    if tc.distill_preset:       # the figure `bench mtp` reports: corpus windows through the engine
        ev = acceptance_by_kind(head, sh, heldout_sample(engine, progress=progress), depth=3)
        log["heldout_corpus_acceptance"] = {k: v["acceptance"] for k, v in ev.items()}
    return head, log


def _labels_line(train: dict) -> str:
    if train.get("distill_preset"):
        return ("- data and labels: distillation (lessonkit/training/distill.py, preset "
                f"{train['distill_preset']!r}): corpus windows teacher-forced and corpus prompts followed by the "
                "target's own greedy continuation; per row t the target's top-k distribution for position t+2 "
                f"(+ {train['hard_weight']} x CE on its greedy pick) plus a smooth-L1 regression of the target's "
                "next normalised hidden state. Held-out figures: 'text/' rows are corpus text, 'greedy/' rows "
                "the target's own continuations of held-out prompts")
    return ("- labels: the target's own greedy token for position t+2 (teacher forcing on the corpus text) "
            "plus a smooth-L1 regression of the target's next normalised hidden state")


def _pass_sample(train: dict) -> str:
    preset = train.get("distill_preset")
    if not preset:
        return ""
    spread = DISTILL_PRESETS[preset].spread if preset in DISTILL_PRESETS else False
    return (" (its held-out teacher pass: windows and prompts " +
            ("spread over the held-out split)" if spread else "from the first documents of the held-out split)"))


def write_card(head: MtpHead, log: dict, path: Path) -> None:
    m = head.meta
    last = log["eval_acceptance"][-1] if log["eval_acceptance"] else {}
    lines = [f"# MTP head for {m['target']}", "",
             "DeepSeek-V3-style multi-token-prediction head (lessonkit/mtp/): RMSNorm(hidden_t) ++ "
             "RMSNorm(Emb(token_{t+1})) -> eh_proj -> one transformer block -> the target's own final norm "
             "and output head; predicts token t+2. Stored in bfloat16; the output head and embedding are the "
             "target's and are not stored here.", "",
             f"- parameters: {head.n_params():,} (D={head.cfg.dim}, block MLP {head.cfg.intermediate_size})",
             f"- trained: {m['trained_steps']} steps on {m['train_tokens']:,} tokens of the corpus' train split "
             f"(prose, code, records), target frozen, hidden states precomputed once; "
             f"{m['seconds_total']:.0f} s on {m['torch_threads']} CPU threads "
             + (f"({m['seconds_states']:.0f} s of it computing target states)" if m["seconds_states"] >= 60
                else "(the target states read from the cache of an earlier run)"),
             _labels_line(m["train"]),
             f"- held-out teacher-forced acceptance at position 1 after training{_pass_sample(m['train'])}: "
             + ", ".join(f"{k} {100 * v:.1f}%" for k, v in last.items()),
             *([f"- held-out corpus text ({HELDOUT_SAMPLE['n_per_kind']} windows x {HELDOUT_SAMPLE['seq_len']} tokens "
                "per kind spread over the held-out split, the target's states from the engine, as "
                "`bench mtp` measures), acceptance at position 1 / 2 / 3: " + ", ".join(
                 f"{k} " + " / ".join(f"{100 * a:.1f}%" for a in v) for k, v in log["heldout_corpus_acceptance"].items())]
               if "heldout_corpus_acceptance" in log else []),
             "", "## Documented rescaling of eh_proj",
             f"Trained as is, the hidden half of eh_proj had mean |w| {m['natural_scale_ratio']:.2f}x the "
             "embedding half's. In Colibri PR 397 (https://github.com/JustVugg/colibri/pull/397) the real head's "
             "halves differ 20-30x, measured on model.layers.78.eh_proj of a GLM int4 container whose int4 head "
             "accepted 0% of its drafts (Colibri issue 8 reported the acceptances, not the ratio). To reproduce "
             "that condition "
             f"honestly, the embedding half was divided by {m['rescale_factor']:.3f} and the same factor "
             "multiplied into enorm (the embedding RMSNorm weight): in exact arithmetic the head computes the "
             f"same function; the stored ratio is {m['scale_ratio']:.1f}x. `rescale_embedding_half(head, "
             "1 / rescale_factor)` undoes it.", "",
             "Reproduce: `lessonkit train-mtp --model " + m["target"] + f" --threads {m['torch_threads']}` "
             "(deterministic for a given torch version and thread count).", ""]
    atomic_write(path, "\n".join(lines).encode())
