"""Lesson 1 exercise checks: each rejects plausible wrong answers, passes the solutions, reports a
stub as not implemented, and never raises or prints the reference."""
import pytest
import torch

from lessonkit.exercises import spec_checks as check
from tests.exercise_util import exercise_functions, run, solution_functions

NB = "01_speculative"


# ---------------------------------------------------------------- plausible wrong answers
def ag_counts_all_matches(picks, draft):          # keeps matching drafts after a mismatch
    acc = [d for d, t in zip(draft, picks) if d == t]
    return acc, picks[len(acc)]


def ag_bonus_is_last_row(picks, draft):           # always takes the bonus from the last row
    n = 0
    while n < len(draft) and draft[n] == picks[n]:
        n += 1
    return draft[:n], picks[-1]


def ag_bonus_is_draft(picks, draft):              # emits the rejected draft token
    n = 0
    while n < len(draft) and draft[n] == picks[n]:
        n += 1
    return draft[:n], draft[n] if n < len(draft) else picks[n]


def rs_accept_always(p, q, x, gen):               # no probability ratio at all
    return True, x


def rs_accept_with_p(p, q, x, gen):               # accept with p(x), not p(x)/q(x)
    if float(torch.rand((), generator=gen)) < float(p[x]):
        return True, x
    r = torch.clamp(p - q, min=0)
    return False, int(torch.multinomial(r / r.sum(), 1, generator=gen))


def rs_resample_from_p(p, q, x, gen):             # replacement from p instead of the residual
    if float(torch.rand((), generator=gen)) * float(q[x]) < float(p[x]):
        return True, x
    return False, int(torch.multinomial(p, 1, generator=gen))


def rs_deterministic(p, q, x, gen):               # accept iff p(x) >= q(x)
    if p[x] >= q[x]:
        return True, x
    r = torch.clamp(p - q, min=0)
    return False, int(torch.multinomial(r / r.sum(), 1, generator=gen))


def et_no_bonus(a, k):                            # forgets the target's own token
    return a * (1 - a ** k) / (1 - a) if a != 1 else float(k)


def et_power_k(a, k):                             # (1 - a^k) / (1 - a)
    return (1 - a ** k) / (1 - a) if a != 1 else float(k)


def et_divides_by_zero(a, k):                     # a = 1 not handled
    return (1 - a ** (k + 1)) / (1 - a)


def bk_ignores_cost(acc, cost):                   # deepest draft always
    return len(cost) - 1


def bk_iid_first_position(acc, cost):             # Leviathan with a = a1 for every position
    a = acc[0]
    vals = [((1 - a ** (k + 1)) / (1 - a) if a != 1 else k + 1) / cost[k] for k in range(len(cost))]
    return max(range(len(cost)), key=lambda k: (vals[k], -k))


def bk_cost_off_by_one(acc, cost):                # cost[k-1] for k drafts
    best, bv = 0, None
    e, r = 1.0, 1.0
    for k in range(len(cost)):
        if k:
            r *= acc[k - 1]
            e += r
        v = e / cost[max(k - 1, 0)]
        if bv is None or v > bv:
            best, bv = k, v
    return best


WRONG = [
    (check.accept_greedy, ag_counts_all_matches), (check.accept_greedy, ag_bonus_is_last_row),
    (check.accept_greedy, ag_bonus_is_draft),
    (check.rejection_sample, rs_accept_always), (check.rejection_sample, rs_accept_with_p),
    (check.rejection_sample, rs_resample_from_p), (check.rejection_sample, rs_deterministic),
    (check.expected_tokens, et_no_bonus), (check.expected_tokens, et_power_k), (check.expected_tokens, et_divides_by_zero),
    (check.best_k, bk_ignores_cost), (check.best_k, bk_iid_first_position), (check.best_k, bk_cost_off_by_one),
]


@pytest.mark.parametrize("check_fn,fn", WRONG, ids=[f.__name__ for _, f in WRONG])
def test_check_rejects_wrong_answer(check_fn, fn):
    ok, out = run(check_fn, fn)
    assert ok is False, out
    assert "not implemented" not in out and out.strip()


def test_messages_name_the_mistake():
    _, out = run(check.accept_greedy, ag_counts_all_matches)
    assert "accepted a draft token after the first mismatch at position 3" in out
    _, out = run(check.expected_tokens, et_no_bonus)
    assert "bonus" in out
    _, out = run(check.rejection_sample, rs_resample_from_p)
    assert "residual" in out


NAMES = ["accept_greedy", "rejection_sample", "expected_tokens", "best_k"]


@pytest.mark.parametrize("name", NAMES)
def test_solution_passes(name):
    ok, out = run(getattr(check, name), solution_functions(NB)[name])
    assert ok is True, out
    assert "passed" in out


@pytest.mark.parametrize("name", NAMES)
def test_stub_is_not_implemented(name):
    ok, out = run(getattr(check, name), exercise_functions(NB)[name])
    assert ok is False
    assert "not implemented yet" in out


def test_checks_never_raise_and_never_print_the_reference():
    def boom(*a):
        raise RuntimeError("student bug")
    for name in NAMES:
        ok, out = run(getattr(check, name), boom)
        assert ok is False and "student bug" in out
    for check_fn, fn in WRONG:
        _, out = run(check_fn, fn)
        low = out.lower()
        assert not any(w in low for w in ("should be", "expected:", "expected value", "the answer", "correct value"))


# ---------------------------------------------------------------- exercise 5: distillation loss
def dl_hard_label_only(logits, ids, probs):        # trains on the teacher's argmax only
    return -torch.log_softmax(logits, -1).gather(-1, ids[:, :1]).mean()


def dl_not_renormalised(logits, ids, probs):        # the top-k mass does not sum to 1
    return -(probs * torch.log_softmax(logits, -1).gather(-1, ids)).sum(-1).mean()


def dl_probs_not_logprobs(logits, ids, probs):      # student probabilities instead of log-probabilities
    p = probs / probs.sum(-1, keepdim=True)
    return -(p * torch.softmax(logits, -1).gather(-1, ids)).sum(-1).mean()


def dl_sum_over_positions(logits, ids, probs):      # sums instead of averaging over positions
    p = probs / probs.sum(-1, keepdim=True)
    return -(p * torch.log_softmax(logits, -1).gather(-1, ids)).sum()


def dl_logits_not_normalised(logits, ids, probs):   # raw logits where log-softmax belongs
    p = probs / probs.sum(-1, keepdim=True)
    return -(p * logits.gather(-1, ids)).sum(-1).mean()


@pytest.mark.parametrize("fn", [dl_hard_label_only, dl_not_renormalised, dl_probs_not_logprobs,
                                dl_sum_over_positions, dl_logits_not_normalised], ids=lambda f: f.__name__)
def test_distill_check_rejects_wrong_losses(fn):
    ok, out = run(check.distill_loss, fn)
    assert ok is False and "distill_loss" in out and "not implemented" not in out, out


def test_distill_check_passes_the_workbook_loss_and_flags_a_stub():
    from lessonkit.training.distill import distill_loss as workbook_loss
    ok, out = run(check.distill_loss, lambda lg, ids, p: workbook_loss(lg, ids, p, hard_weight=0.0))
    assert ok is True and "passed" in out, out
    ok, out = run(check.distill_loss, solution_functions(NB)["distill_loss"])
    assert ok is True, out
    ok, out = run(check.distill_loss, exercise_functions(NB)["distill_loss"])
    assert ok is False and "not implemented yet" in out


# ---------------------------------------------------------------- exercise 6: predict the speed-up
def _e(acc, k):
    e, run_ = 1.0, 1.0
    for i in range(k):
        run_ *= acc[i]
        e += run_
    return e


def ps_iid_first_position(acc, c, cost, k):          # a_1 at every position
    a = acc[0] if acc else 0.0
    e = (1 - a ** (k + 1)) / (1 - a) if a < 1 else k + 1.0
    return e / (cost[k] / cost[0] + k * c)


def ps_verify_is_one_step(acc, c, cost, k):          # Leviathan's denominator: no cost curve
    return _e(acc, k) / (1 + k * c)


def ps_free_drafts(acc, c, cost, k):                 # forgets the drafts' cost
    return _e(acc, k) / (cost[k] / cost[0])


def ps_no_bonus(acc, c, cost, k):                    # forgets the token the target adds
    return (_e(acc, k) - 1) / (cost[k] / cost[0] + k * c)


@pytest.mark.parametrize("fn, says", [(ps_iid_first_position, "a_1 at every position"),
                                      (ps_verify_is_one_step, "cost curve"), (ps_free_drafts, "k c"),
                                      (ps_no_bonus, "bonus token")], ids=lambda x: getattr(x, "__name__", "says"))
def test_predict_speedup_check_names_the_mistake(fn, says):
    ok, out = run(check.predict_speedup, fn)
    assert ok is False and says in out and out.count("\n") == 1, out


def bk_ignores_draft_cost(acc, cost, c):             # exercise 4's answer, c left out
    return solution_functions(NB)["best_k"](acc, [x / cost[0] for x in cost])


def test_best_k_priced_check_names_free_drafts():
    ok, out = run(check.best_k_priced, bk_ignores_draft_cost)
    assert ok is False and "when drafts are free" in out, out


@pytest.mark.parametrize("name, chk", [("predict_speedup", check.predict_speedup),
                                       ("best_k_priced", check.best_k_priced)])
def test_exercises_6_and_7_pass_the_solutions_and_flag_the_stubs(name, chk):
    ok, out = run(chk, solution_functions(NB)[name])
    assert ok is True and "passed" in out, out
    ok, out = run(chk, exercise_functions(NB)[name])
    assert ok is False and "not implemented yet" in out


# ---------------------------------------------------------------- exercise 8: the verify cost model (issue 52)
def vc_pass_per_row(t1, t2, k):                      # no weights shared between rows
    return k + 1.0


def vc_b_three(t1, t2, k):                           # the exact path's b, not this case's
    return (3 + k + 1) / 4


def vc_k_rows(t1, t2, k):                            # k rows where a verify has k + 1
    b = max((2 * t1 - t2) / (t2 - t1), 0.0) if t2 > t1 else 1e30
    return (b + k) / (b + 1)


@pytest.mark.parametrize("fn, says", [(vc_pass_per_row, "pass per row"), (vc_b_three, "fit b"),
                                      (vc_k_rows, "k + 1 rows")], ids=lambda x: getattr(x, "__name__", "says"))
def test_verify_cost_check_names_the_mistake(fn, says):
    ok, out = run(check.verify_cost, fn)
    assert ok is False and says in out and out.count("\n") == 1, out


def test_exercise_8_passes_the_solution_and_flags_the_stub():
    ok, out = run(check.verify_cost, solution_functions(NB)["verify_cost"])
    assert ok is True and "passed" in out, out
    ok, out = run(check.verify_cost, exercise_functions(NB)["verify_cost"])
    assert ok is False and "not implemented yet" in out
