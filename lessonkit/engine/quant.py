"""Weight quantisation lab: symmetric absmax int8 / int4, per row or per group of columns.

A matrix W [rows, cols] is stored as integers q and float scales s; dequantised W' = q * s.
  per-row     one scale per row:            s[r]    = max_c |W[r, c]| / qmax
  group-wise  one scale per `group` columns: s[r, g] = max_{c in g} |W[r, c]| / qmax
qmax = 127 (int8) or 7 (int4, symmetric: -7..7). Round to nearest, ties to even (torch.round).

The pitfall this module exists to show: with ONE scale per row, every weight smaller than s/2 is
rounded to exactly zero. If a row mixes two column blocks whose magnitudes differ 20-30x (an MTP
head's eh_proj: hidden-state half and embedding half), int4 has only 7 levels per sign, so the whole
small block lands below s/2 and vanishes. int8 (127 levels) or a scale per group of columns keeps it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from lessonkit.errors import LessonkitError


@dataclass(frozen=True)
class QuantScheme:
    name: str
    bits: int | None          # None = no quantisation (float)
    group_size: int | None    # None = one scale per row

    @property
    def qmax(self) -> int:
        return 2 ** (self.bits - 1) - 1


SCHEMES = {
    "none": QuantScheme("none", None, None),
    "int8": QuantScheme("int8", 8, None),
    "int4": QuantScheme("int4", 4, None),
    "int4-g64": QuantScheme("int4-g64", 4, 64),
    "int4-g32": QuantScheme("int4-g32", 4, 32),
}


def get_scheme(scheme: str | QuantScheme) -> QuantScheme:
    if isinstance(scheme, QuantScheme):
        return scheme
    if scheme in SCHEMES:
        return SCHEMES[scheme]
    # int4-g<N> / int8-g<N> with any group size
    for bits in (4, 8):
        pre = f"int{bits}-g"
        if isinstance(scheme, str) and scheme.startswith(pre) and scheme[len(pre):].isdigit() and int(scheme[len(pre):]) > 0:
            return QuantScheme(scheme, bits, int(scheme[len(pre):]))
    raise LessonkitError(f"unknown quantisation scheme {scheme!r}: known {', '.join(SCHEMES)} (or int4-g<N>)")


@dataclass
class QuantTensor:
    q: torch.Tensor           # int8 [rows, cols]
    scales: torch.Tensor      # float32 [rows, n_groups]
    scheme: QuantScheme
    shape: tuple

    @property
    def nbytes(self) -> int:
        bits = self.scheme.bits * self.q.numel()
        return bits // 8 + self.scales.numel() * 2   # scales stored as fp16


def quantise(w: torch.Tensor, scheme: str | QuantScheme) -> QuantTensor:
    """Symmetric absmax quantisation of a 2-D matrix, one scale per row or per column group."""
    s = get_scheme(scheme)
    if s.bits is None:
        raise LessonkitError("scheme 'none' does not quantise")
    if w.dim() != 2:
        raise LessonkitError(f"quantise expects a 2-D matrix, got shape {tuple(w.shape)}")
    rows, cols = w.shape
    g = cols if s.group_size is None else s.group_size
    if cols % g:
        raise LessonkitError(f"group size {g} does not divide the {cols} columns")
    wf = w.detach().float().reshape(rows, cols // g, g)
    scales = wf.abs().amax(-1) / s.qmax                       # [rows, n_groups]
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    q = torch.round(wf / safe[..., None]).clamp(-s.qmax, s.qmax).to(torch.int8)
    return QuantTensor(q.reshape(rows, cols), scales, s, (rows, cols))


def dequantise(qt: QuantTensor) -> torch.Tensor:
    rows, cols = qt.shape
    n = qt.scales.shape[1]
    return (qt.q.float().reshape(rows, n, cols // n) * qt.scales[..., None]).reshape(rows, cols)


def fake_quantise(w: torch.Tensor, scheme: str | QuantScheme) -> torch.Tensor:
    """quantise then dequantise: the float matrix a quantised kernel effectively multiplies by."""
    s = get_scheme(scheme)
    if s.bits is None:
        return w.detach().clone()
    return dequantise(quantise(w, s)).to(w.dtype)


def block_report(w: torch.Tensor, w_deq: torch.Tensor, blocks: dict[str, slice]) -> dict:
    """Per column block: mean |w|, fraction rounded to zero, relative reconstruction error."""
    out = {}
    for name, sl in blocks.items():
        a, b = w[:, sl].float(), w_deq[:, sl].float()
        nz = a != 0
        out[name] = {
            "mean_abs": float(a.abs().mean()),
            "absmax": float(a.abs().max()),
            "frac_zero": float(((b == 0) & nz).sum() / max(int(nz.sum()), 1)),
            "rel_error": float((a - b).norm() / a.norm().clamp_min(1e-30)),
        }
    return out


def scale_ratio(w: torch.Tensor, blocks: dict[str, slice]) -> float:
    """max over blocks / min over blocks of the mean |w| per column block (1 = balanced)."""
    m = [float(w[:, sl].float().abs().mean()) for sl in blocks.values()]
    return max(m) / max(min(m), 1e-30)
