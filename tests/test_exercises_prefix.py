"""Lesson 4 exercise checks: each rejects plausible wrong answers, passes the solutions, reports a stub
as not implemented, and never raises."""
import hashlib
import json

import pytest

from lessonkit.exercises import prefix_checks as check
from tests.exercise_util import exercise_functions, run, solution_functions

NB = "04_prefix_cache"
NAMES = ("fingerprint", "block_hashes", "longest_prefix_match", "snapshot_bytes_per_token", "restore_break_even_mb_s")


# ---- plausible wrong answers ---------------------------------------------------------------------
def fp_shape_only(weights, tokenizer_json, config, dtype, quant, format_version):   # Colibri's check
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()


def fp_names_only(weights, tokenizer_json, config, dtype, quant, format_version):   # keyed by file names (LMCache-like)
    rec = [sorted(weights), tokenizer_json, config, dtype, quant, format_version]
    return hashlib.sha256(json.dumps(rec, sort_keys=True).encode()).hexdigest()


def fp_order_dependent(weights, tokenizer_json, config, dtype, quant, format_version):
    rec = [list(weights.items()), tokenizer_json, config, dtype, quant, format_version]
    return hashlib.sha256(json.dumps(rec).encode()).hexdigest()


def fp_no_dtype(weights, tokenizer_json, config, dtype, quant, format_version):
    rec = [sorted(weights.items()), tokenizer_json, config, quant, format_version]
    return hashlib.sha256(json.dumps(rec, sort_keys=True).encode()).hexdigest()


def fp_sorted_hashes(weights, tokenizer_json, config, dtype, quant, format_version):  # loses which file is which
    rec = [sorted(weights.values()), tokenizer_json, config, dtype, quant, format_version]
    return hashlib.sha256(json.dumps(rec, sort_keys=True).encode()).hexdigest()


def fp_python_hash(weights, tokenizer_json, config, dtype, quant, format_version):
    return f"{hash((tuple(sorted(weights.items())), tokenizer_json, dtype, quant)) & (2**64 - 1):016x}"


def bh_unchained(token_ids, block_size, root):          # each block hashed alone
    return [hashlib.sha256((root + str(token_ids[i:i + block_size])).encode()).hexdigest()
            for i in range(0, len(token_ids) - block_size + 1, block_size)]


def bh_partial_block(token_ids, block_size, root):      # hashes the partial last block too
    out, parent = [], root
    for i in range(0, len(token_ids), block_size):
        parent = hashlib.sha256((parent + str(token_ids[i:i + block_size])).encode()).hexdigest()
        out.append(parent)
    return out


def bh_ambiguous(token_ids, block_size, root):          # digits concatenated without a separator
    out, parent = [], root
    for i in range(len(token_ids) // block_size):
        parent = hashlib.sha256((parent + "".join(map(str, token_ids[i * block_size:(i + 1) * block_size]))).encode()).hexdigest()
        out.append(parent)
    return out


def bh_no_root(token_ids, block_size, root):
    out, parent = [], ""
    for i in range(len(token_ids) // block_size):
        parent = hashlib.sha256((parent + "|" + repr(token_ids[i * block_size:(i + 1) * block_size])).encode()).hexdigest()
        out.append(parent)
    return out


def _blocks_equal(a, b, i, bs):
    return a[i * bs:(i + 1) * bs] == b[i * bs:(i + 1) * bs]


def lpm_any_block(query_ids, saved, block_size):        # counts equal blocks anywhere, not a prefix
    best, best_n = None, 0
    for name, ids in saved.items():
        n = sum(block_size for i in range(min(len(query_ids), len(ids)) // block_size)
                if _blocks_equal(query_ids, ids, i, block_size))
        if n > best_n:
            best, best_n = name, n
    return best, best_n


def lpm_token_level(query_ids, saved, block_size):      # exact token LCP, ignoring blocks
    best, best_n = None, 0
    for name, ids in saved.items():
        n = 0
        while n < min(len(query_ids), len(ids)) and query_ids[n] == ids[n]:
            n += 1
        if n > best_n:
            best, best_n = name, n
    return best, best_n


def lpm_first_hit(query_ids, saved, block_size):        # the first entry sharing a block, not the longest
    for name, ids in saved.items():
        n = 0
        while n + block_size <= min(len(query_ids), len(ids)) and query_ids[n:n + block_size] == ids[n:n + block_size]:
            n += block_size
        if n:
            return name, n
    return None, 0


def lpm_off_by_one(query_ids, saved, block_size):       # "<" instead of "<=": misses a block at the end
    best, best_n = None, 0
    for nm, ids in saved.items():
        k = 0
        while k + block_size < min(len(query_ids), len(ids)) and query_ids[k:k + block_size] == ids[k:k + block_size]:
            k += block_size
        if k > best_n:
            best, best_n = nm, k
    return best, best_n


def sb_keys_only(config, bytes_per_element):            # K without V
    return config.n_layers * config.n_kv_heads * config.head_dim * bytes_per_element


def sb_query_heads(config, bytes_per_element):          # every query head, as if there were no GQA
    return 2 * config.n_layers * config.n_heads * config.head_dim * bytes_per_element


def sb_right(config, bytes_per_element):
    return 2 * config.n_layers * config.n_kv_heads * config.head_dim * bytes_per_element


def be_bytes_per_s(bytes_per_token, prefill_s_per_token):
    return bytes_per_token / prefill_s_per_token


def be_mib(bytes_per_token, prefill_s_per_token):
    return bytes_per_token / prefill_s_per_token / 2 ** 20


def be_upside_down(bytes_per_token, prefill_s_per_token):
    return prefill_s_per_token / bytes_per_token * 1e6


def be_right(bytes_per_token, prefill_s_per_token):
    return bytes_per_token / prefill_s_per_token / 1e6


WRONG = [
    (check.fingerprint, fp_shape_only, "weights"),
    (check.fingerprint, fp_names_only, "weights"),
    (check.fingerprint, fp_order_dependent, "key order"),
    (check.fingerprint, fp_no_dtype, "dtype"),
    (check.fingerprint, fp_sorted_hashes, "which file"),
    (check.fingerprint, fp_python_hash, "SHA-256"),
    (check.block_hashes, bh_unchained, "chain"),
    (check.block_hashes, bh_partial_block, "full blocks"),
    (check.block_hashes, bh_ambiguous, "unambiguously"),
    (check.block_hashes, bh_no_root, "root"),
    (check.longest_prefix_match, lpm_any_block, "more than"),
    (check.longest_prefix_match, lpm_token_level, "whole number of blocks"),
    (check.longest_prefix_match, lpm_first_hit, "not the longest"),
    (check.longest_prefix_match, lpm_off_by_one, "not the longest"),
    (check.snapshot_bytes_per_token, sb_keys_only, "keys and its values"),
    (check.snapshot_bytes_per_token, sb_query_heads, "KV heads"),
    (check.restore_break_even_mb_s, be_bytes_per_s, "bytes per second"),
    (check.restore_break_even_mb_s, be_mib, "MiB/s"),
    (check.restore_break_even_mb_s, be_upside_down, "upside down"),
]


@pytest.mark.parametrize("check_fn,wrong,says", WRONG, ids=[w.__name__ for _, w, _ in WRONG])
def test_each_check_rejects_a_plausible_wrong_answer(check_fn, wrong, says):
    ok, out = run(check_fn, wrong)
    assert ok is False
    assert says in out, out
    assert out.count("\n") == 1


def test_solutions_pass_and_the_library_agrees():
    ns = solution_functions(NB)
    for name in NAMES:
        ok, out = run(getattr(check, name), ns[name])
        assert ok is True, out
    # the library's own functions pass the same checks
    from lessonkit.prefix_cache import snapshot as pcm
    ok, out = run(check.block_hashes, pcm.block_hashes)
    assert ok, out

    def lib_match(query, saved, bs):
        return pcm.longest_prefix_match(pcm.block_hashes(query, bs), {k: pcm.block_hashes(v, bs) for k, v in saved.items()})

    def lib_match_tokens(query, saved, bs):
        name, depth = lib_match(query, saved, bs)
        return name, depth * bs
    ok, out = run(check.longest_prefix_match, lib_match_tokens)
    assert ok, out


def test_stubs_report_not_implemented_without_raising():
    ns = exercise_functions(NB)
    for name in NAMES:
        ok, out = run(getattr(check, name), ns[name])
        assert ok is False and out.strip() == f"{name}: not implemented yet"


def test_a_crashing_answer_is_reported_not_raised():
    def boom(*a):
        raise KeyError("oops")
    for name in NAMES:
        ok, out = run(getattr(check, name), boom)
        assert ok is False and "raised KeyError" in out


def test_on_this_machine_judges_both_functions_on_the_measured_numbers():
    """The check on this machine's numbers (a tiny model prefilled, saved and restored) passes the formulas and
    the solutions, and fails a wrong answer to either, naming the mistake; stubs are reported, not raised."""
    def both(bytes_fn, be_fn):
        return run(lambda _: check.on_this_machine(bytes_fn, be_fn, smoke=True), None)
    ok, out = both(sb_right, be_right)
    assert ok is True and "measured here" in out and "restoring" in out, out
    ns = solution_functions(NB)
    ok, out = both(ns["snapshot_bytes_per_token"], ns["restore_break_even_mb_s"])
    assert ok is True, out
    ok, out = both(sb_query_heads, be_right)
    assert ok is False and "on this model's config" in out and "KV heads" in out, out
    ok, out = both(sb_right, be_mib)
    assert ok is False and "on this run's numbers" in out and "MiB/s" in out, out
    stubs = exercise_functions(NB)
    ok, out = both(stubs["snapshot_bytes_per_token"], stubs["restore_break_even_mb_s"])
    assert ok is False and out.count("not implemented yet") == 2, out
