"""Lesson 2: MTP heads. Drafting is exact, the doctor tells a broken quantised head from a good one,
and the shipped heads predict the token after next far better than the controls."""
import io
import json
from contextlib import redirect_stdout

import pytest
import torch

from lessonkit.cli import main
from lessonkit.engine import quant
from lessonkit.errors import LessonkitError
from lessonkit.engine.generate import generate
from lessonkit.measure.mtp import prompts_from_corpus
from lessonkit.mtp.doctor import doctor, tensor_problems
from lessonkit.mtp.drafter import MtpDrafter
from lessonkit.mtp.evaluate import acceptance_by_kind, eval_windows, pooled_acceptance, target_states, teacher_forced
from lessonkit.mtp.head import (MtpConfig, MtpHead, Shared, block, eh_scale_ratio, head_logits, init_head, load_head,
                                mtp_input, rescale_embedding_half)
from lessonkit.speculative.states import forward_for
from lessonkit.speculative.verify import speculative_generate


# ---------------------------------------------------------------- quantisation lab
def test_per_row_int4_zeroes_a_small_column_block_and_groups_keep_it():
    g = torch.Generator().manual_seed(0)
    w = torch.cat([torch.randn(32, 64, generator=g), torch.randn(32, 64, generator=g) / 25], dim=1)
    blocks = {"hidden": slice(0, 64), "embedding": slice(64, 128)}
    assert quant.scale_ratio(w, blocks) > 20
    r4 = quant.block_report(w, quant.fake_quantise(w, "int4"), blocks)
    assert r4["embedding"]["frac_zero"] > 0.97 and r4["hidden"]["frac_zero"] < 0.2
    for s, most in (("int8", 0.35), ("int4-g64", 0.2), ("int4-g32", 0.2)):   # int8 still zeroes ~1/5
        r = quant.block_report(w, quant.fake_quantise(w, s), blocks)
        assert r["embedding"]["frac_zero"] < most, s
        assert r["embedding"]["rel_error"] < most, s


def test_quantise_roundtrip_levels_and_errors():
    w = torch.randn(8, 64)
    qt = quant.quantise(w, "int4-g32")
    assert qt.q.abs().max() <= 7 and qt.scales.shape == (8, 2)
    assert torch.equal(quant.dequantise(qt), quant.fake_quantise(w, "int4-g32"))
    assert torch.equal(quant.fake_quantise(w, "none"), w)
    assert quant.get_scheme("int4-g16").group_size == 16
    with pytest.raises(LessonkitError, match="int5"):
        quant.get_scheme("int5")
    with pytest.raises(LessonkitError, match="group size 48"):
        quant.quantise(w, "int4-g48")


# ---------------------------------------------------------------- a tiny random target (fast, no shipped files)
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from hf_tiny import make_hf
    from lessonkit.models.registry import load_model
    _, d = make_hf("olmoe", tmp_path_factory.mktemp("mtp"))
    eng = load_model(str(d))
    cfg = MtpConfig.from_target(eng.config, 64)
    head = MtpHead(cfg, init_head(cfg, seed=1, std=0.2))
    return eng, head


@pytest.mark.parametrize("q", ["none", "int4"])
def test_mtp_drafting_is_exact_on_a_random_model(tiny, q):
    eng, head = tiny
    drafter = MtpDrafter(eng, head, quant=q)
    try:
        for prompt, k in (([1, 2, 3], 3), (list(range(10, 50)), 2)):
            ref = generate(eng, prompt, 20, use_eos=False).token_ids
            assert speculative_generate(eng, drafter, prompt, 20, k=k, use_eos=False).token_ids == ref
    finally:
        drafter.close()


def test_drafter_matches_the_teacher_forced_head(tiny):
    eng, head = tiny
    sh = Shared.from_engine(eng)
    row = torch.randint(0, eng.config.vocab_size, (40,), generator=torch.Generator().manual_seed(3))
    st = target_states(eng, row[None], progress=False)
    drafter = MtpDrafter(eng, head)
    try:
        drafter.reset([])
        forward_for(drafter, eng, row[:30], eng.new_cache())
        d = drafter.propose(row[:31].tolist(), 1).tokens
    finally:
        drafter.close()
    x = mtp_input(head.w, head.cfg, st.hidden[:, :30], sh.embed[row[1:31]][None])
    y, _, _ = block(head.w, head.cfg, sh, x, torch.arange(30))
    assert d == [int(head_logits(sh, y)[0, -1].argmax())]


def test_rescaling_the_embedding_half_keeps_the_function(tiny):
    eng, head = tiny
    sh = Shared.from_engine(eng)
    h2 = rescale_embedding_half(head, 25.0)
    assert eh_scale_ratio(h2) == pytest.approx(25 * eh_scale_ratio(head), rel=1e-4)
    hid, e = torch.randn(1, 5, head.cfg.dim), sh.embed[torch.arange(1, 6)][None]
    y1, _, _ = block(head.w, head.cfg, sh, mtp_input(head.w, head.cfg, hid, e), torch.arange(5))
    y2, _, _ = block(h2.w, h2.cfg, sh, mtp_input(h2.w, h2.cfg, hid, e), torch.arange(5))
    assert torch.allclose(y1, y2, atol=1e-4)


def test_tensor_checks_find_missing_nonfinite_and_untrained(tiny, tmp_path):
    _, head = tiny
    untrained = MtpHead(head.cfg, init_head(head.cfg, seed=5))
    probs = tensor_problems(untrained)
    assert any("enorm" in p and "never trained" in p for p in probs)
    assert any("eh_proj" in p and "random" in p for p in probs)
    w = dict(head.w)
    w["wq"] = w["wq"].clone()
    w["wq"][0, 0] = float("nan")
    del w["w_up"]
    probs = tensor_problems(MtpHead(head.cfg, w))
    assert any("w_up is missing" in p for p in probs) and any("wq has 1 non-finite" in p for p in probs)
    bad = tmp_path / "bad.safetensors"
    from safetensors.torch import save_file
    save_file({"eh_proj": torch.zeros(2, 2)}, str(bad), metadata={"config": json.dumps(head.cfg.__dict__)})
    with pytest.raises(LessonkitError, match="bad.safetensors: tensor 'hnorm' is missing"):
        load_head(bad)


# ---------------------------------------------------------------- the shipped heads on the real models
def _engine(name):
    from lessonkit.models.registry import load_model
    return load_model(name)


@pytest.fixture(scope="module")
def moe():
    eng = _engine("tiny-moe")
    states = eval_windows(eng, 2, 128, progress=False)
    return eng, load_head(eng), states


def test_float_head_beats_the_shifted_target_control(moe):
    eng, head, states = moe
    sh = Shared.from_engine(eng)
    for kind, st in states.items():
        r = teacher_forced(head, sh, st, depth=2)
        assert r["acceptance"][0] > r["shifted_control"] + 0.15, (kind, r)
    rand = MtpHead(head.cfg, init_head(head.cfg, seed=9))
    assert pooled_acceptance(acceptance_by_kind(rand, sh, states, 1), 1)["acceptance"][0] < 0.05


def _doctor_cli(argv):
    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = main(argv)
    return rc, buf.getvalue()


def test_doctor_flags_per_row_int4_and_passes_int8(moe):
    eng, head, states = moe
    bad = doctor(eng, head, "int4", states=states)
    assert bad["healthy"] is False
    assert any("embedding half of eh_proj is zero after quantisation" in v and "never sees the input token" in v
               for v in bad["verdict"])
    assert bad["quantised"]["acceptance"][0] < 0.5 * bad["float"]["acceptance"][0]
    good = doctor(eng, head, "int8", states=states)
    assert good["healthy"] is True, good["verdict"]
    assert good["quant_matrices"]["eh_proj"]["blocks"]["embedding"]["frac_zero"] < 0.5


def test_doctor_cli_exit_codes_and_json(moe):
    rc, out = _doctor_cli(["mtp-doctor", "--model", "tiny-moe", "--quant", "int4", "--windows", "1", "--json"])
    rep = json.loads(out)
    assert rc == 1 and rep["healthy"] is False and rep["quant"] == "int4"
    rc, out = _doctor_cli(["mtp-doctor", "--model", "tiny-moe", "--quant", "int4-g32", "--windows", "1"])
    assert rc == 0 and "HEALTHY" in out


@pytest.mark.parametrize("name", ["tiny-moe", "smollm2-135m"])
def test_mtp_drafting_identical_to_plain_greedy(name):
    eng = _engine(name)
    prompts = prompts_from_corpus(eng, 1, 24)
    drafter = MtpDrafter(eng)
    try:
        accepted = 0
        for kind in ("prose", "records") if name == "smollm2-135m" else ("prose", "code", "records"):
            p = prompts[kind][0]
            n = 16 if name == "smollm2-135m" else 32
            ref = generate(eng, p, n, use_eos=False).token_ids
            r = speculative_generate(eng, drafter, p, n, k=2, use_eos=False)
            assert r.token_ids == ref, kind
            accepted += r.stats["num_accepted_tokens"]
        assert accepted > 0
    finally:
        drafter.close()


def _judge_like(eng, drafter, prefix, item, n, pc=None):
    """Prefix in one chunk (restored from `pc` when it holds it), then the item through the speculative
    loop, as the capstone's judge does; returns (tokens, accepted drafts, restored positions)."""
    from lessonkit.engine.generate import generate as plain
    prompt = prefix + item
    cache = eng.new_cache(len(prompt) + n + 8)
    restored = pc.lookup_and_restore(prefix, cache, max_tokens=len(prefix)) if pc is not None else 0
    drafter.reset(prompt)
    if not restored:
        forward_for(drafter, eng, prefix, cache, last_only=True)
        if pc is not None:
            pc.save(prefix, cache)
    r = speculative_generate(eng, drafter, prompt, n, k=3, cache=cache, use_eos=False, reset_drafter=False)
    ref_cache = eng.new_cache(len(prompt) + n + 8)
    eng.forward(prefix, ref_cache, last_only=True)
    assert r.token_ids == plain(eng, prompt, n, cache=ref_cache, use_eos=False).token_ids
    return r.token_ids, r.stats["num_accepted_tokens"], restored


@pytest.mark.parametrize("which", ["random", "tiny-moe"])
def test_mtp_drafts_as_well_behind_a_restored_prefix(which, tiny, tmp_path):
    """After a prefix-cache restore the head has no hidden states for the restored positions; the
    drafter recomputes them, so it accepts exactly as many drafts as without the cache, same tokens."""
    from lessonkit.prefix_cache.cache import PrefixCache
    eng, head = tiny if which == "random" else (_engine("tiny-moe"), None)
    prompts = prompts_from_corpus(eng, 2, 40) if which == "tiny-moe" else None
    prefix, item = (prompts["records"][0], prompts["records"][1][:12]) if prompts else (list(range(5, 45)), [7, 8, 9])
    drafter = MtpDrafter(eng, head)
    try:
        off = _judge_like(eng, drafter, prefix, item, 24)
        pc = PrefixCache(tmp_path / "pc", eng, block_size=4)
        cold = _judge_like(eng, drafter, prefix, item, 24, pc)
        warm = _judge_like(eng, drafter, prefix, item, 24, pc)
        assert cold[2] == 0 and warm[2] == len(prefix), (cold[2], warm[2])
        assert off[:2] == cold[:2] == warm[:2]
        assert drafter.stats["recomputed_states"] == len(prefix)
        if which == "tiny-moe":
            assert off[1] > 0
    finally:
        drafter.close()


# ---- FR-Spec: the head's argmax over the target's frequent tokens only (speculative.vocab) ------------------
def test_frequent_head_is_the_full_argmax_restricted_to_its_rows(tiny):
    """FrequentHead picks the best of its rows: the full argmax when that token is kept, never a token outside;
    ranking by corpus frequency is deterministic, most frequent first."""
    from lessonkit.speculative.vocab import FrequentHead, draft_head, frequent_tokens
    eng, head = tiny
    V = eng.config.vocab_size
    ids = frequent_tokens(eng, V // 4)
    assert len(set(ids.tolist())) == V // 4 and torch.equal(ids, frequent_tokens(eng, V // 4))
    assert torch.equal(frequent_tokens(eng, V // 8), ids[:V // 8])
    sh = Shared.from_engine(eng)
    fh = FrequentHead(sh.lm_head, ids)
    g = torch.Generator().manual_seed(0)
    kept_best = 0
    for _ in range(50):
        h = torch.randn(eng.config.dim, generator=g)
        full = sh.lm_head.float() @ h
        pick = fh.argmax(h)
        assert pick in set(ids.tolist())
        assert pick == int(ids[int(full[ids].argmax())])
        kept_best += int(int(full.argmax()) in set(ids.tolist()) and pick == int(full.argmax()))
    assert kept_best > 0
    assert draft_head(eng, sh.lm_head, None) is None and draft_head(eng, sh.lm_head, V) is None
    with pytest.raises(ValueError, match="must be in 1"):
        frequent_tokens(eng, V + 1)


@pytest.mark.parametrize("n", [None, 64])
def test_mtp_drafting_is_exact_with_a_frequent_vocabulary(tiny, n):
    """Exact with the whole output layer and with 64 of its rows; the small head proposes kept tokens only."""
    eng, head = tiny
    drafter = MtpDrafter(eng, head, draft_vocab=n)
    assert (drafter.frequent is None) == (n is None)
    try:
        for prompt, k in (([1, 2, 3], 3), (list(range(10, 50)), 2)):
            ref = generate(eng, prompt, 20, use_eos=False).token_ids
            drafter.reset(prompt)
            assert speculative_generate(eng, drafter, prompt, 20, k=k, use_eos=False).token_ids == ref
        if n:
            eng.forward(list(range(10, 50)), eng.new_cache())
            kept = set(drafter.frequent.ids.tolist())
            assert set(drafter.propose(list(range(10, 51)), 3).tokens) <= kept
    finally:
        drafter.close()


def test_heldout_sample_is_spread_over_the_split(moe):
    """The head's reported figure reads windows from the whole held-out split (HELDOUT_SAMPLE), not its first
    documents: distinct, in order, seeded, and reaching past the split's first quarter."""
    from lessonkit.mtp.evaluate import HELDOUT_SAMPLE, text_windows
    eng = moe[0]
    n, T = HELDOUT_SAMPLE["n_per_kind"], HELDOUT_SAMPLE["seq_len"]
    assert HELDOUT_SAMPLE["spread"] and n >= 12
    head = text_windows(eng, "code", "heldout", 400, T)             # the split from its start, window by window
    rows = {tuple(r): i for i, r in enumerate(head.tolist())}
    a = text_windows(eng, "code", "heldout", n, T, spread=True)
    assert torch.equal(a, text_windows(eng, "code", "heldout", n, T, spread=True))
    slots = [rows[tuple(r)] for r in a.tolist()]
    assert slots == sorted(set(slots)) and len(slots) == n
    assert max(slots) > len(head) // 4 and slots != list(range(n))
