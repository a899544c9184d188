"""The MTP head as a drafter: k tokens from the target's last hidden state (the drafter protocol of
lessonkit.speculative.drafters). It declares that it reads the target's last hidden state (needs_states = ()),
so the target's forwards over its sequence hand it the states they compute anyway (lessonkit.speculative.states)."""
from __future__ import annotations

import torch

from lessonkit.errors import LessonkitError
from lessonkit.engine.model import rms_norm
from lessonkit.mtp.head import MtpHead, Shared, block, head_logits, load_head, mtp_input
from lessonkit.speculative.drafters import Draft
from lessonkit.speculative.vocab import DRAFT_VOCAB, draft_head


class MtpDrafter:
    """Drafts k tokens with an MTP head from the target's last hidden state (drafter protocol).

    propose(context, k) needs the target's hidden state at position len(context) - 2 (the target has
    run every context token but the last, which is the token it picked); it returns no draft when that
    state is unknown. The head keeps its own KV cache over its depth-1 stream; positions the target
    re-runs (after a rejection) invalidate the head's rows from there on.

    The states come through record(start, states), from every forward of the target that runs through
    speculative.states.forward_for (the speculative loop's prefill and verifies, the capstone's prefix).
    Behind a restored prefix (lessonkit.prefix_cache) the target's first forward after `reset` starts
    at position n > 0 and the hidden states of positions 0 .. n-1 were never computed. The drafter
    then recomputes them once with one forward of those n tokens on a scratch cache (the same chunk
    the plain engine prefills, so the states are the same bits) and keeps them for the next request
    with the same prefix: the head sees what it would have seen without the prefix cache.
    """

    name = "mtp"
    needs_states = ()                            # the target's last hidden state alone

    def __init__(self, target, head: MtpHead | None = None, quant: str = "none", dtype=torch.float32,
                 draft_vocab: int | None = DRAFT_VOCAB):
        self.target = target
        head = head if head is not None else load_head(target)
        if head.cfg.dim != target.config.dim or head.cfg.vocab_size != target.config.vocab_size:
            raise LessonkitError(f"MTP head (D={head.cfg.dim}, V={head.cfg.vocab_size}) does not fit target "
                                 f"{target.name} (D={target.config.dim}, V={target.config.vocab_size})")
        self.head = (head.quantised(quant) if quant != "none" else head).to(dtype)
        self.sh = Shared.from_engine(target)
        # FR-Spec: the argmax over the target's most frequent tokens only (speculative.vocab); None: all rows
        self.frequent = draft_head(target, self.sh.lm_head, draft_vocab)
        self._memo = None                        # (restored prefix, its states): kept for the next request
        self.reset([])

    def close(self):
        """Drop the restored prefix's states kept for the next request."""
        self._memo = None

    def record(self, start: int, states: torch.Tensor):
        """The target's states [T, 1, D] of positions start .. start+T-1 (speculative.states)."""
        hid = states[:, -1]
        if self.n_hidden == 0 and self.missing == 0:
            self.missing = start                 # positions restored from a prefix cache: no states yet
        T = hid.shape[0]
        if start + T > self.hidden.shape[0]:
            grow = torch.zeros(max(2 * self.hidden.shape[0], start + T), self.hidden.shape[1])
            grow[:self.hidden.shape[0]] = self.hidden
            self.hidden = grow
        self.hidden[start:start + T] = hid
        self.n_hidden = start + T
        self.stale_from = min(self.stale_from, start)

    def reset(self, prompt_ids):
        c = self.head.cfg
        self.hidden = torch.zeros(256, c.dim)
        self.n_hidden, self.stale_from, self.missing = 0, 0, 0
        n = self.sh.cos.shape[0]
        self.K = torch.zeros(1, n, c.n_kv_heads, c.head_dim, dtype=self.head.dtype)
        self.V = torch.zeros_like(self.K)
        self.kv_len, self.kv_tokens = 0, []
        self.stats = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0, "recomputed_states": 0}

    def _recover_missing(self, context: list[int]) -> None:
        """Hidden states of the restored positions 0 .. missing-1: from the memo of the last prefix, or
        one forward of those tokens on a scratch cache."""
        n, self.missing = self.missing, 0
        key = tuple(context[:n])
        memo = self._memo
        if memo is None or memo[0] != key:
            _, hid = self.target.forward(list(key), self.target.new_cache(n + 1), return_hidden=True, last_only=True)
            memo = self._memo = (key, hid.float())
            self.stats["recomputed_states"] += n
        self.hidden[:n] = memo[1]

    @torch.no_grad()
    def propose(self, context, k: int):
        context = list(context)
        t = len(context) - 2
        if k <= 0 or t < 0 or self.n_hidden <= t:
            return Draft([])
        if self.missing:
            self._recover_missing(context)
        dt, cfg, w = self.head.dtype, self.head.cfg, self.head.w
        # rows of the head's stream that no longer match: rerun target positions or changed tokens
        keep = min(self.kv_len, self.stale_from)
        for j in range(keep):
            if self.kv_tokens[j] != context[j + 1]:
                keep = j
                break
        self.stale_from = self.n_hidden
        self.kv_len, self.kv_tokens = keep, self.kv_tokens[:keep]
        if t + 1 > self.sh.cos.shape[0] - k:
            return Draft([])
        # bring the depth-1 stream up to row t
        rows = torch.arange(self.kv_len, t + 1)
        x = mtp_input(w, cfg, self.hidden[rows].to(dt)[None],
                      self.sh.embed[torch.tensor(context[self.kv_len + 1:t + 2])].to(dt)[None])
        ctx = (self.K[:, :self.kv_len], self.V[:, :self.kv_len])
        y, kn, vn = block(w, cfg, self.sh, x, rows, ctx=ctx)
        self.K[:, self.kv_len:t + 1], self.V[:, self.kv_len:t + 1] = kn, vn
        self.kv_tokens.extend(context[self.kv_len + 1:t + 2])
        self.kv_len = t + 1
        prev = y[:, -1:]
        draft = [self._pick(prev)]
        ctx = (self.K[:, :t + 1], self.V[:, :t + 1])
        for s in range(2, k + 1):
            x = mtp_input(w, cfg, prev, self.sh.embed[torch.tensor([draft[-1]])].to(dt)[None])
            prev, _, _ = block(w, cfg, self.sh, x, torch.tensor([t + s - 1]), ctx=ctx,
                               base=torch.tensor([t]), chain=True)
            draft.append(self._pick(prev))
        self.stats["num_drafts"] += 1
        self.stats["num_draft_tokens"] += len(draft)
        return Draft(draft)

    def _pick(self, y: torch.Tensor) -> int:
        """The head's greedy token for its output y [1, 1, D]: over every row of the target's output layer,
        or over the frequent rows only."""
        if self.frequent is None:
            return int(head_logits(self.sh, y).argmax(-1))
        return self.frequent.argmax(rms_norm(y.float(), self.sh.norm, self.sh.eps))

    def update(self, context, num_accepted: int):
        self.stats["num_accepted_tokens"] += int(num_accepted)
