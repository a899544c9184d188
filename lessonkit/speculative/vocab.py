"""A drafter's output layer over the target's most frequent tokens only (FR-Spec: Zhao et al. 2025,
"FR-Spec: Accelerating Large-Vocabulary Language Models via Frequency-Ranked Speculative Sampling",
arXiv:2502.14856).

A drafter that shares the target's output layer pays for all of it on every draft token: for smollm2-135m
that is 49,152 x 576 = 28 M multiply-adds and 113 MB of float32 weights, a fifth of a whole target step.
Most rows belong to tokens that almost never come: on the corpus' train split the 8,192 most frequent
SmolLM2 tokens make up 99% of all tokens. A draft that picks its argmax among those rows only costs a
sixth of the layer; it can no longer propose a rare token, which costs acceptance only where the target
would have picked one. Lossless like every drafter: the target verifies each draft token.
"""
from __future__ import annotations

import torch

from lessonkit.files.safe_files import sha256_file
from lessonkit.engine.row_weight import RowWeight
from lessonkit.workloads.corpus import KINDS, load_documents

DRAFT_VOCAB = 8192            # rows kept for targets with a larger vocabulary (smollm2-135m); 0: all rows
COUNT_TOKENS = 150_000        # train-split tokens counted per kind of text (about 1 s with SmolLM2's tokenizer)
_MEMO: dict = {}


def frequent_tokens(engine, n: int, per_kind: int = COUNT_TOKENS) -> torch.Tensor:
    """The n most frequent token ids of `engine`'s tokenizer on the corpus' train split (the first
    `per_kind` tokens of each kind), most frequent first; ties by id. Memoised per tokenizer."""
    if not 0 < n <= engine.config.vocab_size:
        raise ValueError(f"frequent_tokens: n={n} must be in 1 .. {engine.config.vocab_size} (the vocabulary)")
    tok = engine.model_dir / "tokenizer.json"          # the ranking depends on the tokenizer only: hashing
    key = (sha256_file(tok) if tok.exists() else engine.fingerprint(), per_kind)   # it skips the weights
    if key not in _MEMO:
        V = engine.config.vocab_size
        counts = torch.zeros(V, dtype=torch.long)
        for kind in KINDS:
            seen = 0
            for doc in load_documents(kind, "train"):
                ids = engine.encode(doc)
                counts += torch.bincount(torch.tensor(ids, dtype=torch.long), minlength=V)
                seen += len(ids)
                if seen >= per_kind:
                    break
        # stable sort on -count: equal counts keep id order, so the ranking is the same everywhere
        _MEMO[key] = torch.sort(-counts, stable=True).indices
    return _MEMO[key][:n].clone()


class FrequentHead:
    """argmax of `h @ lm_head.T` restricted to the rows of `ids` (a row-kernel product over those rows)."""

    def __init__(self, lm_head: torch.Tensor, ids: torch.Tensor):
        if lm_head.dim() != 2 or ids.dim() != 1 or int(ids.max()) >= lm_head.shape[0]:
            raise ValueError(f"FrequentHead: ids must index the {lm_head.shape[0]} rows of the output layer")
        self.ids = ids.to(torch.long)
        self.rows = RowWeight(lm_head[self.ids].float().T.contiguous())     # [D, n]

    def __len__(self) -> int:
        return len(self.ids)

    def argmax(self, h: torch.Tensor) -> int:
        """The token id of the largest kept logit for one normalised hidden state h [.., D]."""
        return int(self.ids[int((h.reshape(1, -1).float() @ self.rows).argmax())])


def draft_head(engine, lm_head: torch.Tensor, n: int | None = DRAFT_VOCAB) -> FrequentHead | None:
    """A FrequentHead of the n most frequent tokens, or None (use the whole layer) when n is 0 / None or
    not smaller than the vocabulary."""
    if not n or n >= engine.config.vocab_size:
        return None
    return FrequentHead(lm_head, frequent_tokens(engine, n))
