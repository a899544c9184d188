"""A head measured on the frozen target's own states: teacher-forced acceptance per draft position,
against controls (the target's pick one position off, a random head) and per kind of text.

The target runs once per window of corpus text (its hidden states and greedy picks are cached on disk,
keyed by its fingerprint); the head then runs on those states, so a head is scored in seconds.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from lessonkit.files.atomic import atomic_write
from lessonkit.errors import LessonkitError
from lessonkit.files.resources import lessonkit_home
from lessonkit.mtp.head import MtpHead, Shared, block, head_logits, mtp_input
from lessonkit.workloads.corpus import EOT, KINDS, load_documents
from lessonkit.workloads.corpus import spread_slots

SPREAD_SEED = 7
# the held-out sample behind the head's figures (`bench mtp`, the card): 12 windows x 128 tokens per kind of
# text, spread over each held-out split. The first 2 windows of each split, used until 2026-12-02, put the
# smollm2 head at 55.6% where this sample measures 49.8% (docs/mtp.md).
HELDOUT_SAMPLE = {"n_per_kind": 12, "seq_len": 128, "spread": True}

def text_windows(engine, kind: str, split: str, n_windows: int, seq_len: int, skip: int = 0,
                 spread: bool = False) -> torch.Tensor:
    """n_windows x seq_len tokens of one corpus part, tokenised with the target's own tokenizer: consecutive
    from the start of the split (after `skip` windows), or with `spread` at seeded distinct window slots over
    the whole split, in order (a sample of all of it rather than of its first documents)."""
    docs = [d for d in load_documents(kind, split) if d.strip()]
    need = None if spread else (skip + n_windows) * seq_len
    ids: list[int] = []
    for d in docs:
        ids.extend(engine.encode(d + EOT))
        if need is not None and len(ids) >= need:
            break
    n = min(n_windows, len(ids) // seq_len - skip)
    if n <= 0:
        raise LessonkitError(f"corpus {kind}.{split} has too few tokens for one window of {seq_len}")
    slots = list(range(skip, skip + n))
    if spread:
        slots = spread_slots(len(ids) // seq_len, n, SPREAD_SEED + (KINDS.index(kind) if kind in KINDS else 0))
    return torch.tensor([ids[s * seq_len:(s + 1) * seq_len] for s in slots], dtype=torch.long).view(n, seq_len)


@dataclass
class TargetStates:
    tokens: torch.Tensor     # [N, T]
    hidden: torch.Tensor     # [N, T, D]  float32: input of the target's final norm
    greedy: torch.Tensor     # [N, T]     target argmax at each position (its pick for position t+1)


def target_states(engine, windows: torch.Tensor, progress: bool = True, desc: str = "target states",
                  dtype=torch.float32) -> TargetStates:
    """One forward of the frozen target per window (fresh cache): hidden states and greedy picks."""
    H, A = [], []
    for row in tqdm(windows, desc=desc, disable=not progress, leave=False):
        cache = engine.new_cache(len(row))
        logits, hid = engine.forward(row, cache, return_hidden=True)
        H.append(hid.to(dtype))
        A.append(logits.argmax(-1))
    return TargetStates(windows, torch.stack(H), torch.stack(A))


def cached_states(engine, kind: str, split: str, n_windows: int, seq_len: int, progress: bool = True,
                  spread: bool = False) -> TargetStates:
    """target_states of corpus windows, cached on disk under $LESSONKIT_HOME/mtp_states (keyed by the
    target's fingerprint: weights, tokenizer, config, dtype) because the big target is slow on 2 cores."""
    d = lessonkit_home() / "mtp_states"
    f = d / f"{engine.name}-{engine.fingerprint()[:16]}-{kind}-{split}-{n_windows}x{seq_len}{'-spread' * spread}.pt"
    if f.exists():
        try:
            return TargetStates(**torch.load(f, weights_only=True))
        except Exception:
            pass
    st = target_states(engine, text_windows(engine, kind, split, n_windows, seq_len, spread=spread), progress,
                       desc=f"{split} {kind}")
    d.mkdir(parents=True, exist_ok=True)
    atomic_write(f, lambda tmp: torch.save({"tokens": st.tokens, "hidden": st.hidden, "greedy": st.greedy}, tmp))
    return st


def eval_windows(engine, n_per_kind: int = 4, seq_len: int = 128, kinds=None, progress: bool = True,
                 spread: bool = False) -> dict:
    """Held-out windows per kind of text, with the target's states, for teacher-forced evaluation
    (spread: sampled over each held-out split, see text_windows)."""
    return {kind: cached_states(engine, kind, "heldout", n_per_kind, seq_len, progress, spread)
            for kind in (kinds or KINDS)}


def heldout_sample(engine, progress: bool = True) -> dict:
    """eval_windows over HELDOUT_SAMPLE: the states behind the head's reported held-out figures."""
    return eval_windows(engine, progress=progress, **HELDOUT_SAMPLE)


# ----------------------------------------------------------------------------- teacher-forced acceptance
@torch.no_grad()
def teacher_forced(head: MtpHead, sh: Shared, st: TargetStates, depth: int = 3, chunk: int = 8) -> dict:
    """Draft acceptance per position with the text as input (teacher forcing).

    Position s (1-based) drafts token t+s+1 from row t; it is accepted when it equals the target's
    greedy pick for that position given the true prefix, greedy[t+s]. Controls: the same drafts scored
    against the target picks one position off (shifted target). rank: the rank (0 = top) of the target's
    pick in the depth-1 draft logits.
    """
    cfg, dt = head.cfg, head.dtype
    N, T = st.tokens.shape
    hits = [0] * depth
    tot = [0] * depth
    shift_hits = 0
    ranks = []
    for i in range(0, N, chunk):
        tok = st.tokens[i:i + chunk]
        hid = st.hidden[i:i + chunk].to(dt)
        A = st.greedy[i:i + chunk]
        B = tok.shape[0]
        # depth 1: rows t = 0 .. T-2
        x = mtp_input(head.w, cfg, hid[:, :T - 1], sh.embed[tok[:, 1:]].to(dt))
        pos = torch.arange(T - 1)
        y, k1, v1 = block(head.w, cfg, sh, x, pos)
        lg = head_logits(sh, y)                                      # [B, T-1, V]
        pred = lg.argmax(-1)
        lab = A[:, 1:]
        hits[0] += int((pred == lab).sum())
        tot[0] += lab.numel()
        shift_hits += int((pred[:, :-1] == A[:, 2:]).sum())         # one position too far
        ranks.append((lg > lg.gather(-1, lab[..., None])).sum(-1).flatten())
        prev = y
        for s in range(2, depth + 1):
            n = T - s                                                # rows t = 0 .. T-1-s
            if n <= 0:
                break
            x = mtp_input(head.w, cfg, prev[:, :n], sh.embed[tok[:, s:s + n]].to(dt))
            base = torch.arange(n)
            y, _, _ = block(head.w, cfg, sh, x, base + s - 1, ctx=(k1, v1), base=base, chain=True)
            pred = head_logits(sh, y).argmax(-1)
            hits[s - 1] += int((pred == A[:, s:s + n]).sum())
            tot[s - 1] += B * n
            prev = y
    ranks = torch.cat(ranks).float()
    acc = [h / t if t else float("nan") for h, t in zip(hits, tot)]
    return {"acceptance": acc, "shifted_control": shift_hits / max(tot[0] - N, 1),
            "rank_median": float(ranks.median()), "rank_mean": float(ranks.mean()),
            "top1": float((ranks == 0).float().mean()), "n_positions": tot[0]}


def acceptance_by_kind(head: MtpHead, sh: Shared, states: dict, depth: int = 3) -> dict:
    return {kind: teacher_forced(head, sh, st, depth) for kind, st in states.items()}


def pooled_acceptance(per_kind: dict, depth: int) -> dict:
    """acceptance_by_kind's results pooled over the kinds of text, each weighted by its positions."""
    n = sum(v["n_positions"] for v in per_kind.values())
    acc = [sum(v["acceptance"][i] * v["n_positions"] for v in per_kind.values()) / n for i in range(depth)]
    shift = sum(v["shifted_control"] * v["n_positions"] for v in per_kind.values()) / n
    rank = sum(v["rank_median"] * v["n_positions"] for v in per_kind.values()) / n
    return {"acceptance": acc, "shifted_control": shift, "rank_median": rank, "by_kind": per_kind}
