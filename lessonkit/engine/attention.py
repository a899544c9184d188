"""Scaled dot-product attention, grouped by kv head: the one attention of the workbook.

Shapes: G kv heads, R query rows per kv head (positions x query heads sharing that kv head, GQA
without copying K/V), S keys, hd head dim. The scores are masked with -inf where `mask` is True, and
the softmax runs in float32 whatever the compute dtype. `own` gives each row one more key and value
of its own (an MTP head's chained drafts attend to the depth-1 stream plus themselves).
"""
from __future__ import annotations

import torch


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float,
           mask: torch.Tensor | None = None, own: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """softmax(q keys^T * scale) values per kv head: q [G, R, hd], keys / values [G, S, hd] -> [G, R, hd].
    own: (key, value) [G, R, hd] that row r alone also attends to."""
    s = torch.matmul(q, keys.transpose(-1, -2)) * scale                  # [G, R, S]
    if mask is not None:
        s = s.masked_fill(mask, float("-inf"))
    if own is None:
        p = torch.softmax(s.float(), dim=-1).to(q.dtype)
        return torch.matmul(p, values)
    s_own = (q * own[0]).sum(-1, keepdim=True) * scale                   # [G, R, 1]
    p = torch.softmax(torch.cat([s, s_own], -1).float(), dim=-1).to(q.dtype)
    return torch.matmul(p[..., :-1], values) + p[..., -1:] * own[1]
