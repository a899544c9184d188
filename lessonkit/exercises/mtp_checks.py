"""Self-checks for the lesson 2 exercises (notebooks/exercises/02_mtp.ipynb).

Each check runs the student's function on fixed and seeded random matrices, prints one plain line
(what is wrong on the first failing case, or how many cases passed) and returns True or False. It
never prints the expected answer. A stub that raises NotImplementedError gets "not implemented yet";
no check raises.

    from lessonkit.exercises import mtp_checks as check
    check.int4_per_row(my_int4_per_row)
"""
from __future__ import annotations

import math

import torch

from lessonkit.exercises import raised

SEED = 2026


def _ref_fake_quant(w: torch.Tensor, qmax: int, group: int | None) -> torch.Tensor:
    rows, cols = w.shape
    g = cols if group is None else group
    x = w.float().reshape(rows, cols // g, g)
    s = x.abs().amax(-1, keepdim=True) / qmax
    q = torch.round(x / torch.where(s > 0, s, torch.ones_like(s))).clamp(-qmax, qmax)
    return (q * s).reshape(rows, cols).double()


def _matrices(seed: int):
    g = torch.Generator().manual_seed(seed)
    two_scales = torch.cat([torch.randn(6, 32, generator=g), torch.randn(6, 32, generator=g) / 25], dim=1)
    with_zero_row = torch.randn(4, 64, generator=g)
    with_zero_row[2] = 0
    cases = [("a 2x8 matrix with one large weight per row",
              torch.tensor([[0.1, -0.2, 0.3, 7.0, 0.0, -0.05, 0.4, 1.0],
                            [-3.0, 0.5, 0.25, -0.75, 1.5, 0.0, 2.0, -1.0]])),
             ("two column blocks 25x apart in scale", two_scales),
             ("a matrix with an all-zero row", with_zero_row)]
    for i in range(3):
        rows, cols = [(5, 64), (16, 128), (3, 256)][i]
        cases.append((f"random {rows}x{cols} (seed {seed + i})", torch.randn(rows, cols, generator=g) * (0.5 + i)))
    return cases


def _call(name: str, fn, *args):
    """(result, None) or (None, message); NotImplementedError -> 'not implemented yet'."""
    try:
        return fn(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args]), None
    except NotImplementedError:
        return None, f"{name}: not implemented yet"
    except Exception as e:  # the student's bug, reported, never raised
        return None, f"{name}: {raised(e)}"


def _as_tensor(got, shape, what: str):
    if not isinstance(got, torch.Tensor):
        try:
            got = torch.as_tensor(got)
        except Exception:
            return None, f"returned {type(got).__name__}; expected a tensor ({what})"
    if tuple(got.shape) != tuple(shape):
        return None, f"returned shape {tuple(got.shape)}; expected the input's shape {tuple(shape)}"
    if not torch.isfinite(got.double()).all():
        return None, "returned non-finite values (a row of zeros needs a scale that does not divide by zero)"
    return got.double(), None


def _fake_quant_check(name: str, fn, qmax: int, group: int | None, extra_args=()) -> bool:
    cases = [(label, w) for label, w in _matrices(SEED) if group is None or w.shape[1] % group == 0]
    for label, w in cases:
        got, err = _call(name, fn, w, *extra_args)
        if err:
            print(err)
            return False
        got, problem = _as_tensor(got, w.shape, "the dequantised matrix")
        if problem:
            print(f"{name}: on case '{label}': {problem}")
            return False
        ref = _ref_fake_quant(w, qmax, group)
        bad = ~torch.isclose(got, ref, rtol=1e-5, atol=1e-6)
        if bad.any():
            r, c = [int(i) for i in bad.nonzero()[0]]
            levels = got[r].unique().numel()
            hint = ""
            if (got.abs() > w.double().abs().amax(1, keepdim=True) * (1 + 1e-6)).any():
                hint = " (some values exceed the row's largest |w|: check the range of the integers)"
            elif levels > 2 * qmax + 1:
                hint = f" (row {r} has {levels} distinct values; at most {2 * qmax + 1} are possible)"
            print(f"{name}: on case '{label}': entry [{r}, {c}] is wrong (input {float(w[r, c]):.4g}){hint}")
            return False
    print(f"{name}: passed all {len(cases)} cases")
    return True


def int4_per_row(fn) -> bool:
    """fn(w [rows, cols]) -> the dequantised matrix after symmetric per-row int4 (integers -7..7)."""
    return _fake_quant_check("int4_per_row", fn, 7, None)


def int4_grouped(fn) -> bool:
    """fn(w, group) -> the dequantised matrix after symmetric int4 with one scale per `group` columns."""
    ok = True
    for group in (32, 16):
        ok = _fake_quant_check(f"int4_grouped(group={group})", fn, 7, group, (group,))
        if not ok:
            return False
    return ok


def eh_proj_diagnosis(fn) -> bool:
    """fn(w [D, 2D]) -> (ratio, embedding_zero_fraction): mean |w| of the hidden half (first D columns)
    over that of the embedding half (last D columns), and the fraction of the embedding half's non-zero
    weights that per-row int4 rounds to exactly zero."""
    g = torch.Generator().manual_seed(SEED + 1)
    cases = []
    for D, r in ((16, 25.0), (32, 3.0), (24, 0.5), (8, 1.0)):
        w = torch.cat([torch.randn(D, D, generator=g), torch.randn(D, D, generator=g) / r], dim=1)
        cases.append((f"D={D}, halves about {r}x apart", w))
    for label, w in cases:
        got, err = _call("eh_proj_diagnosis", fn, w)
        if err:
            print(err)
            return False
        try:
            ratio, zero = (float(x) for x in got)
        except Exception:
            print(f"eh_proj_diagnosis: on case '{label}': return a pair (ratio, embedding_zero_fraction)")
            return False
        D = w.shape[0]
        ref_ratio = float(w[:, :D].abs().mean() / w[:, D:].abs().mean())
        deq = _ref_fake_quant(w, 7, None)
        nz = w[:, D:] != 0
        ref_zero = float(((deq[:, D:] == 0) & nz).sum() / nz.sum())
        if not math.isclose(ratio, ref_ratio, rel_tol=1e-4):
            hint = " (hidden half over embedding half, mean of |w|)" if math.isclose(ratio * ref_ratio, 1, rel_tol=1e-3) else ""
            print(f"eh_proj_diagnosis: on case '{label}': the ratio is wrong{hint}")
            return False
        if not math.isclose(zero, ref_zero, abs_tol=1e-6):
            print(f"eh_proj_diagnosis: on case '{label}': the zero fraction of the embedding half is wrong "
                  "(it is a fraction in [0, 1] of that half's weights, after per-row int4 over the whole row)")
            return False
    print(f"eh_proj_diagnosis: passed all {len(cases)} cases")
    return True


def critical_ratio(fn) -> bool:
    """fn(qmax) -> the ratio r of the halves' largest |w| (hidden over embedding) from which symmetric per-row
    quantisation with levels -qmax..qmax rounds every weight of the embedding half to 0. The row's scale is its
    largest |w| over qmax, set by the hidden half; a weight becomes 0 when it is at most half a scale step."""
    g = torch.Generator().manual_seed(SEED + 3)
    for qmax in (7, 127, 3, 15):
        got, err = _call("critical_ratio", fn, qmax)
        if err:
            print(err)
            return False
        try:
            r = float(got)
        except (TypeError, ValueError):
            print(f"critical_ratio: qmax={qmax}: return one number, a ratio")
            return False
        ok = r > 0
        for f, want_all in ((1.001, True), (0.97, False)):        # just past r every weight is 0, just below not
            hid = torch.randn(8, 64, generator=g)
            emb = torch.randn(8, 64, generator=g)
            emb = emb / emb.abs().amax(-1, keepdim=True) * hid.abs().amax(-1, keepdim=True) / (r * f if ok else 1)
            deq = _ref_fake_quant(torch.cat([hid, emb], 1), qmax, None)[:, 64:]
            ok = ok and bool((deq == 0).all()) == want_all
        if not ok:
            hint = " (a weight rounds to 0 below half a step, not below one step)" if math.isclose(r, qmax, rel_tol=1e-6) else ""
            print(f"critical_ratio: qmax={qmax}: got {r:.4g}, but at that ratio the embedding half is not "
                  f"exactly where it all rounds to 0{hint}")
            return False
    print("critical_ratio: passed for qmax 7 (int4), 127 (int8), 3 and 15: compare with the 20-30x of Colibri PR 397")
    return True


def on_the_real_head(int4_per_row, model: str = "tiny-moe") -> None:
    """Your per-row int4 applied to the shipped head's eh_proj (stored with its halves 25x apart): the share of
    each half's weights your quantiser sends to 0, and the same for the natural-ratio control."""
    from lessonkit.models.registry import load_model
    from lessonkit.exercises import NOT_IMPLEMENTED, call
    from lessonkit.mtp.head import load_head, rescale_embedding_half
    head = load_head(load_model(model))
    natural = rescale_embedding_half(head, 1 / head.meta["rescale_factor"])
    for label, h in (("stored (25x)", head), ("natural ratio", natural)):
        w, b = h.w["eh_proj"].float(), h.cfg.eh_blocks()
        got, error = call(int4_per_row, (w,))
        if error:
            print(f"int4_per_row: {error}" if error != NOT_IMPLEMENTED else "int4_per_row: not implemented yet")
            return
        zero = (torch.as_tensor(got) == 0).float()
        print(f"{model} head, {label}: your int4 zeroes {zero[:, b['embedding']].mean():.1%} of the embedding half, "
              f"{zero[:, b['hidden']].mean():.1%} of the hidden half")
