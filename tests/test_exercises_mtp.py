"""Lesson 2 exercise checks: each rejects plausible wrong answers, passes the solutions, reports a
stub as not implemented, and never raises or prints the reference."""
import io
import json
from contextlib import redirect_stdout
from pathlib import Path

import pytest
import torch

from lessonkit.exercises import mtp_checks as check

ROOT = Path(__file__).resolve().parents[1]


def notebook_functions(sub: str):
    nb = json.loads((ROOT / "notebooks" / sub / "02_mtp.ipynb").read_text())
    ns: dict = {"torch": torch}
    for cell in nb["cells"]:
        src = "".join(cell["source"])
        if cell["cell_type"] == "code" and src.startswith("def "):
            exec(compile(src, "02_mtp.ipynb", "exec"), ns)
    return ns


def run(check_fn, fn):
    buf = io.StringIO()
    with redirect_stdout(buf):
        ok = check_fn(fn)
    return ok, buf.getvalue()


# ---------------------------------------------------------------- plausible wrong answers
def pr_asymmetric(w):                     # -8..7 with s = max/8: the full int4 range, not symmetric absmax
    s = w.abs().amax(1, keepdim=True) / 8
    s = torch.where(s > 0, s, torch.ones_like(s))
    return torch.round(w / s).clamp(-8, 7) * s


def pr_per_tensor(w):                     # one scale for the whole matrix
    s = w.abs().max() / 7
    return torch.round(w / s).clamp(-7, 7) * s


def pr_floor(w):                          # truncation instead of rounding
    s = w.abs().amax(1, keepdim=True) / 7
    s = torch.where(s > 0, s, torch.ones_like(s))
    return torch.trunc(w / s) * s


def pr_nan_zero_row(w):                   # divides by a zero scale
    s = w.abs().amax(1, keepdim=True) / 7
    return torch.round(w / s).clamp(-7, 7) * s


def pr_returns_ints(w):                   # forgets to dequantise
    s = w.abs().amax(1, keepdim=True) / 7
    s = torch.where(s > 0, s, torch.ones_like(s))
    return torch.round(w / s).clamp(-7, 7)


def gr_per_row(w, group):                 # ignores the group
    return pr_floor(w) * 0 + notebook_functions("solutions")["int4_per_row"](w)


def gr_column_major(w, group):            # groups down the rows (transpose), not along them
    f = notebook_functions("solutions")["int4_grouped"]
    rows, cols = w.shape
    return f(w.t().contiguous().reshape(cols, rows), group if rows % group == 0 else rows).reshape(cols, rows).t()


def gr_wrong_reshape(w, group):           # reshape(rows, group, cols // group): strided groups
    rows, cols = w.shape
    x = w.reshape(rows, group, cols // group)
    s = x.abs().amax(1, keepdim=True) / 7
    s = torch.where(s > 0, s, torch.ones_like(s))
    return (torch.round(x / s).clamp(-7, 7) * s).reshape(rows, cols)


def dx_inverted(w):                       # embedding over hidden
    r, z = notebook_functions("solutions")["eh_proj_diagnosis"](w)
    return 1 / r, z


def dx_max_ratio(w):                      # ratio of max |w| instead of mean |w|
    D = w.shape[0]
    _, z = notebook_functions("solutions")["eh_proj_diagnosis"](w)
    return float(w[:, :D].abs().max() / w[:, D:].abs().max()), z


def dx_halves_quantised_separately(w):    # quantises the embedding half on its own: never zero
    D = w.shape[0]
    sol = notebook_functions("solutions")
    r, _ = sol["eh_proj_diagnosis"](w)
    deq = sol["int4_per_row"](w[:, D:])
    return r, float((deq == 0).float().mean())


def dx_whole_matrix_zero(w):              # zero fraction over the whole row, not the embedding half
    D = w.shape[0]
    sol = notebook_functions("solutions")
    r, _ = sol["eh_proj_diagnosis"](w)
    return r, float((sol["int4_per_row"](w) == 0).float().mean())


WRONG = [
    (check.int4_per_row, pr_asymmetric), (check.int4_per_row, pr_per_tensor), (check.int4_per_row, pr_floor),
    (check.int4_per_row, pr_nan_zero_row), (check.int4_per_row, pr_returns_ints),
    (check.int4_grouped, gr_per_row), (check.int4_grouped, gr_column_major), (check.int4_grouped, gr_wrong_reshape),
    (check.eh_proj_diagnosis, dx_inverted), (check.eh_proj_diagnosis, dx_max_ratio),
    (check.eh_proj_diagnosis, dx_halves_quantised_separately), (check.eh_proj_diagnosis, dx_whole_matrix_zero),
]


@pytest.mark.parametrize("check_fn,fn", WRONG, ids=[f.__name__ for _, f in WRONG])
def test_check_rejects_wrong_answer(check_fn, fn):
    ok, out = run(check_fn, fn)
    assert ok is False
    assert "not implemented" not in out and out.strip()


NAMES = ["int4_per_row", "int4_grouped", "eh_proj_diagnosis", "critical_ratio"]


@pytest.mark.parametrize("fn", [lambda q: q, lambda q: 2 * q + 2, lambda q: 0.0, lambda q: "14"],
                         ids=["one step", "past it", "zero", "a string"])
def test_critical_ratio_check_rejects_wrong_answers(fn):      # issue 52: exercise 3 checks the ratio
    ok, out = run(check.critical_ratio, fn)
    assert ok is False and out.startswith("critical_ratio:") and "not implemented" not in out, out


@pytest.mark.parametrize("name", NAMES)
def test_solution_passes(name):
    ok, out = run(getattr(check, name), notebook_functions("solutions")[name])
    assert ok is True, out
    assert "passed" in out


@pytest.mark.parametrize("name", NAMES)
def test_stub_is_not_implemented(name):
    ok, out = run(getattr(check, name), notebook_functions("exercises")[name])
    assert ok is False
    assert "not implemented yet" in out


def test_checks_never_raise_and_never_print_the_reference():
    def boom(*a):
        raise RuntimeError("student bug")
    for name in NAMES:
        ok, out = run(getattr(check, name), boom)
        assert ok is False and "student bug" in out
    ok, out = run(check.int4_per_row, pr_floor)
    assert ok is False and "is wrong" in out and "expected" not in out and "should be" not in out
