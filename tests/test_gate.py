"""The utility gate (k="auto"): Cascade's test-then-set decides from what whole steps measured, not from the cost
model alone; it switches drafting off where steps cost more than they give, goes deep where drafts are right, and a
drafter's next request starts from the last decision."""
import pytest
import torch

from lessonkit.engine.engine import Engine
from lessonkit.speculative.drafters import OracleDrafter
from lessonkit.speculative.gate import DepthGate, UtilityGate
from lessonkit.speculative.verify import speculative_generate
from tests.hf_tiny import make_hf

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return Engine(make_hf("olmoe", tmp_path_factory.mktemp("gate"))[1])


def _run(gate: UtilityGate, steps: int, accept, step_s) -> list[int]:
    """Drive the gate as the loop does: accept(k) drafts accepted at depth k, step_s(k) the step's seconds."""
    ks = []
    for _ in range(steps):
        k = gate.choose()
        ks.append(k)
        gate.observe(k, accept(k), verify_s=0.0, draft_s=0.0, asked=k, step_s=step_s(k))
    return ks


def test_measured_steps_overrule_the_cost_model():
    """The cost model says verification is free and the priors say drafts are mostly right; the drafts are half
    right, but each drafting step measures five times a plain one: the gate must settle on k = 0."""
    gate = UtilityGate(DepthGate([1.0] * 7, k_max=6))
    ks = _run(gate, 200, accept=lambda k: k // 2, step_s=lambda k: 5.0 if k else 1.0)
    assert ks[-100:].count(0) >= 90, ks
    assert any(ks[100:]), "it still tests now and then"
    assert gate.utility(gate.tested[-1]) < 1.0


def test_it_goes_deep_where_drafts_are_right():
    gate = UtilityGate(DepthGate([1.0 + 0.1 * j for j in range(9)], k_max=8))
    ks = _run(gate, 120, accept=lambda k: k, step_s=lambda k: 1.0 + 0.1 * k)
    assert max(ks[-50:]) >= 4 and ks[-50:].count(0) <= 6, ks


@pytest.mark.parametrize("k_max", [0])
def test_k_max_zero_never_drafts(k_max):
    gate = UtilityGate(DepthGate([1.0], k_max=k_max))
    assert set(_run(gate, 50, accept=lambda k: k, step_s=lambda k: 1.0)) == {0}


def test_a_request_starts_from_the_last_decision():
    first = UtilityGate(DepthGate([1.0] * 5, k_max=4))
    _run(first, 50, accept=lambda k: 0, step_s=lambda k: 2.0 if k else 1.0)      # ends inside a set phase
    assert first.last_set == 0
    second = UtilityGate(DepthGate([1.0] * 5, k_max=4))
    second.resume(first.memory())
    left = len(first.plan)
    assert left and _run(second, left, accept=lambda k: 0, step_s=lambda k: 1.0) == [0] * left
    other = UtilityGate(DepthGate([1.0] * 9, k_max=8))
    other.resume(first.memory())                    # another depth range: the memory does not fit, a fresh start
    assert other.last_set is None and other.plan == [] and other.step_s == {}


def test_the_loop_carries_the_gate_across_requests(target):
    """speculative_generate leaves the gate's memory on the drafter; the next request starts in its set phase; the
    output stays plain greedy's either way (the exactness tests hold it)."""
    eng = target
    d = OracleDrafter(eng, 1.0, horizon=80)
    cost = [1.0 + 0.2 * j for j in range(9)]
    speculative_generate(eng, d, list(range(10, 30)), 40, k="auto", cost=cost, learn_cost=False)
    assert d.gate_memory["last_set"] == 0
    again = speculative_generate(eng, d, list(range(12, 32)), 12, k="auto", cost=cost, learn_cost=False)
    assert again.stats["k_hist"] == {0: again.stats["forwards"] - 1}


def test_it_climbs_past_a_shallow_depth_that_does_not_pay():
    """A drafter with a large fixed cost a call (a draft model catching up, a head's first layer): one draft a step
    does not pay, four (and eight) do. The cost model, charging the same cost per draft token at every depth, ranks depth 1 first;
    the test phase must still reach the depth that pays (Cascade's hill climb), where it only tested depth 1 before."""
    gate = UtilityGate(DepthGate([1.0 + 1.0 * j for j in range(9)], k_max=8))
    assert max(range(1, gate.k_max + 1), key=gate.depth.value) == 1      # the depth it tests first
    ks = _run(gate, 200, accept=lambda k: k, step_s=lambda k: 2.2 + 0.1 * k if k else 1.0)
    assert gate.utility(1) < gate.margin < gate.utility(4)
    assert sum(k >= 4 for k in ks[-100:]) >= 80, ks


def test_a_phase_first_step_is_not_timed():
    """The first step of a phase at a new depth carries the drafter's catch-up (a draft model prefills what it did not
    see while drafting was off): its seconds are not that depth's, so neither the step times nor the draft cost keep them."""
    gate = UtilityGate(DepthGate([1.0] * 5, k_max=4))
    seen = []
    for i in range(40):
        k = gate.choose()
        first = gate.catch_up
        seen.append((k, first))
        gate.observe(k, k, verify_s=1.0, draft_s=100.0 if first else 0.1 * k, asked=k, step_s=100.0 if first else 1.0)
    assert any(first for _, first in seen), "a phase at a new depth began"
    assert all(s < 100.0 for times in gate.step_s.values() for s in times)
    assert gate.depth.t_draft < 1.0


def test_a_set_phase_ends_where_its_steps_stop_paying():
    """Records' drafts are right, the prose request after them is not: a set phase at k > 0 must not run its span out
    at a loss (Cascade's phases outlive a request here): within a few steps of the change the gate tests again."""
    gate = UtilityGate(DepthGate([1.0 + 0.1 * j for j in range(9)], k_max=8))
    for _ in range(200):                            # into a set phase with more than 2 * test_steps steps left
        _run(gate, 1, accept=lambda k: k, step_s=lambda k: 1.0 + 0.1 * k)
        if gate.stage == "set" and len(gate.plan) > 2 * gate.test_steps:
            break
    assert gate.stage == "set" and gate.last_set >= 4 and len(gate.plan) > 2 * gate.test_steps, (gate.stage, gate.plan)
    ks = _run(gate, 3 * gate.test_steps, accept=lambda k: 0, step_s=lambda k: 1.0 + 0.1 * k)
    assert 0 in ks, ks


def test_it_does_not_climb_where_drafts_are_mostly_wrong():
    """The hill climb tries a deeper depth only where that depth could pay: with one draft in ten right, a test
    phase tries one depth and sets k = 0 (each deeper test is steps lost)."""
    gate = UtilityGate(DepthGate([1.0 + 0.1 * j for j in range(9)], k_max=8))
    right = iter(range(10_000))
    ks = _run(gate, 300, accept=lambda k: int(k > 0 and next(right) % 10 == 0),
              step_s=lambda k: 1.5 + 0.1 * k if k else 1.0)
    assert len({k for k in ks if k}) == 1, sorted(set(ks))
    assert ks[-100:].count(0) >= 90


def test_steps_that_ask_nothing_run_plain():
    """k = 0's steps where no free part is asked (a drafter without them, or while they are off) are a plain run: its
    seconds are s(0), every utility's yardstick; while the free parts are on they are asked on every step (no plain
    run: on records their match drafts most steps), and while they are off the steps run plain as long as they stay
    off."""
    gate = UtilityGate(DepthGate([1.0] * 5, k_max=4))
    assert gate.plain_steps(own=True) == 0                         # the test phase's k = 0 steps ask the free parts
    assert gate.plain_steps(own=False) == gate.test_steps          # ... and ask nothing of a drafter without them
    gate.observe_plain([0.5] * gate.test_steps)
    assert gate.step_s[0] == [0.5] * gate.test_steps and gate.plain == gate.steps == gate.test_steps
    assert gate.plain_steps(own=False) == 0                        # the test depth drafts
    gate.plan, gate.stage = [0] * 10, "set"
    assert gate.plain_steps(own=True) == 0                         # the free parts are asked each step
    gate.free_off = 4
    assert gate.plain_steps(own=True) == 4 and gate.plain_steps(own=False) == 10
    gate.observe_plain([0.5] * 4)
    assert gate.free_off == 0 and gate.plan == [0] * 6


def test_free_parts_pay_for_their_misses():
    """A step on which the free parts were asked and nothing drafted is theirs (their lookup cost it), not k = 0's:
    with lookups that never match, their utility falls below one and the gate switches them off."""
    gate = UtilityGate(DepthGate([1.0] * 5, k_max=0))
    gate.observe_plain([1.0] * 3)
    for _ in range(gate.test_steps):
        assert gate.free_allowed()
        gate.observe_free(1, 0, 1.2)
    assert gate.free_utility() < 1.0 and not gate.free_allowed()


def _measured(gate: UtilityGate, seconds: dict, accepted_of_50: list[int]) -> UtilityGate:
    """A gate that has seen 50 drafts reach each position, `accepted_of_50[i]` of them accepted at position i + 1,
    and eight whole steps at each depth of `seconds` (depth -> seconds a step)."""
    n = gate.k_max
    gate.depth.reached = [50] * n
    gate.depth.accepted = (accepted_of_50 + [0] * n)[:n]
    gate.step_s = {k: [s] * 8 for k, s in seconds.items()}
    return gate


def test_a_depth_is_judged_by_every_steps_acceptance_not_its_last_three():
    """Half of the drafts right at every position (E(1) = 1.5 tokens a step at 1.2 plain steps: a utility of 1.25),
    but depth 1's last three steps happened to be rejections: the set decision must rest on the counts of every
    drafting step, not on three steps' luck (docs/speculative.md, "The utility gate against a fixed depth"); a set
    phase's early end still reads its own last steps (a request whose drafts stopped being right)."""
    gate = _measured(UtilityGate(DepthGate([1.0] * 5, k_max=4)), {0: 1.0, 1: 1.2}, [25, 25, 25, 25])
    gate.step_tokens = {0: [1] * 8, 1: [1, 1, 1]}
    assert gate.utility(1) == pytest.approx(1.5 / 1.2) and gate.utility(1, recent=True) < 1.0
    gate.stage, gate.tested = "test", [1]
    gate.depth.k_max = 1                                 # nothing deeper to climb to: the phase decides now
    assert gate._next_plan()[0] == 1


def test_a_deeper_depth_that_lost_is_not_tested_again():
    """Depth 2's remembered steps took two plain steps for 1.75 tokens (utility 0.875) where depth 1 gives 1.25: a
    test phase that finds depth 1 paying does not spend three steps on depth 2 again; a depth never measured is
    still climbed to where depth 1 pays."""
    seconds = {0: 1.0, 1: 1.2, 2: 2.0}
    gate = _measured(UtilityGate(DepthGate([1.0] * 5, k_max=4)), seconds, [25, 25, 25, 25])
    gate.stage, gate.tested = "test", [1]
    assert gate._next_plan()[0] == 1 and gate.tested == [1]         # set at depth 1, no test of depth 2
    fresh = _measured(UtilityGate(DepthGate([1.0] * 5, k_max=4)), {0: 1.0, 1: 1.2}, [25, 25, 25, 25])
    fresh.stage, fresh.tested = "test", [1]
    assert fresh._next_plan()[0] == 2 and fresh.tested == [1, 2]


def test_a_test_phase_starts_at_the_best_measured_depth():
    """Depths 1 and 3 ran (3 the better by its measured steps); the next test phase starts at 3, not where the cost
    model's forward-only seconds rank first."""
    gate = _measured(UtilityGate(DepthGate([1.0 + 0.01 * j for j in range(5)], k_max=4)),
                     {0: 1.0, 1: 1.3, 3: 1.5}, [45, 45, 45, 45])
    assert max(range(1, 5), key=gate.depth.value) != 3
    gate.stage, gate.tested = "test", []
    assert gate._next_plan() == [3] * gate.test_steps


def test_acceptance_by_position_counts_only_steps_that_drafted_that_deep():
    """Two steps, every draft right: one drafts 1 token, one 3. Position 2 was drafted once and accepted once: 1.0
    (taking every step that accepted position 1 as having drafted position 2 reads 0.5)."""
    from lessonkit.speculative.gate import acceptance_by_position, conditional_per_pos
    from lessonkit.speculative.verify import _Tally
    tally = _Tally(width=4)
    tally.step(1, 1, 0.0, 0.0, 0)
    tally.step(3, 3, 0.0, 0.0, 0)
    tally.step(2, 0, 0.0, 0.0, 0)
    stats = {"num_accepted_tokens_per_pos": tally.per_pos, "num_drafts": tally.num_drafts,
             "num_reached_per_pos": tally.reached}
    assert tally.reached == [3, 1, 1, 0]
    assert acceptance_by_position(stats) == [2 / 3, 1.0, 1.0, 0.0]
    assert conditional_per_pos(tally.per_pos, tally.num_drafts)[1] == 0.5


def test_a_gated_run_of_right_drafts_reads_full_acceptance_at_every_depth_it_drafted(target):
    from lessonkit.speculative.gate import acceptance_by_position
    from lessonkit.speculative.verify import total_stats
    runs = [speculative_generate(target, OracleDrafter(target, 0.0), p, 40, k="auto").stats for p in ([1, 2, 3], [4, 5])]
    t = total_stats(runs)
    assert len({k for s in runs for k in s["k_hist"]}) > 2, "the gate drafted to several depths"
    acc = acceptance_by_position(t)
    assert [a for a, r in zip(acc, t["num_reached_per_pos"]) if r] == [1.0] * sum(1 for r in t["num_reached_per_pos"] if r)
