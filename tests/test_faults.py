"""Fault injection and bad input (issue 21): symlinks, flipped bits in weights, snapshots and cache
entries, read-only directories, deep nesting under a memory limit, bad values. Each case asserts what
the issue asks: nothing outside the target directory changed, no wrong answer served, no traceback,
the output kept. The CLI cases run lessonkit.cli.main in-process (a LessonkitError is one line and
exit 2; anything else would raise here, i.e. a traceback) or in a subprocess where a limit is the point.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from lessonkit.cli import main
from lessonkit.prefix_cache.cache import PrefixCache, PrefixCacheWarning
from test_prefix_cache import empty_cache, fake_cache, make

ROOT = Path(__file__).resolve().parents[1]
IDS = list(range(200, 240))


def tree_digest(d: Path) -> dict:
    """Every file under d (symlinks not followed) -> sha256 of its bytes: 'nothing changed' is ==."""
    out = {}
    for p in sorted(Path(d).rglob("*")):
        if p.is_file() and not p.is_symlink():
            out[str(p.relative_to(d))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def read_only(monkeypatch, directory: Path) -> None:
    """Make `directory` (and everything under it) read-only for this process: every write, create,
    rename, remove or utime there fails with EACCES, as on a read-only mount or a directory owned by
    another user (chmod alone does not stop root, who runs these tests in some containers)."""
    root = str(Path(directory).resolve())

    def under(p) -> bool:
        return os.path.abspath(os.fspath(p)).startswith(root)

    def deny(name):
        raise PermissionError(errno.EACCES, "Permission denied", name)

    real = {n: getattr(os, n) for n in ("open", "mkdir", "replace", "rename", "unlink", "utime")}
    writing = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

    def _open(p, flags, *a, **k):
        if flags & writing and under(p):
            deny(p)
        return real["open"](p, flags, *a, **k)

    def guarded(name, n_paths=1):
        def f(*a, **k):
            if any(under(x) for x in a[:n_paths]):
                deny(a[0])
            return real[name](*a, **k)
        return f

    monkeypatch.setattr(os, "open", _open)
    for name, n in (("mkdir", 1), ("replace", 2), ("rename", 2), ("unlink", 1), ("utime", 1)):
        monkeypatch.setattr(os, name, guarded(name, n))


GEN = ["generate", "--model", "tiny-moe", "--prompt", "The river keeps its own counsel", "--max-new-tokens", "6",
       "--json"]


def generate_cli(capsys, *extra) -> tuple[int, dict | None, str]:
    code = main(GEN + list(extra))
    out = capsys.readouterr()
    return code, (json.loads(out.out) if code == 0 else None), out.err


# ---- prefix cache: verify, read-only, saving failures, relabelled snapshots ------------------------------------
def test_verify_lists_bad_files_keeps_them_and_exits_nonzero(tmp_path, capsys):
    code, plain, _ = generate_cli(capsys)
    assert code == 0
    d = tmp_path / "pc"
    assert generate_cli(capsys, "--prefix-cache", str(d))[0] == 0
    (snap,) = list((d / "kv").glob("*/*.safetensors"))
    data = snap.read_bytes()
    snap.write_bytes(data[: len(data) // 2])                    # truncated
    foreign = snap.with_name("0" * 40 + ".safetensors")
    foreign.write_bytes(b"not a snapshot")
    before = tree_digest(d)
    assert main(["prefix-cache", "verify", str(d), "--model", "tiny-moe", "--json"]) == 1
    rep = json.loads(capsys.readouterr().out)
    assert len(rep["bad"]) == 2 and rep["valid"] == 0
    assert any(snap.name in b and "truncated" in b for b in rep["bad"])
    assert tree_digest(d) == before                              # reported, nothing deleted
    # the next use repairs: the bad files are removed, recomputed, and the answer is plain generate's
    with pytest.warns(PrefixCacheWarning):
        code, res, _ = generate_cli(capsys, "--prefix-cache", str(d))
    assert code == 0 and res["token_ids"] == plain["token_ids"] and not foreign.exists()
    assert main(["prefix-cache", "verify", str(d), "--model", "tiny-moe", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["bad"] == []


def test_unwritable_snapshot_directory_keeps_the_generation(tmp_path, capsys, monkeypatch):
    code, plain, _ = generate_cli(capsys)
    d = tmp_path / "pc"
    from lessonkit.models.registry import load_model
    sub = PrefixCache(d, load_model("tiny-moe")).subdir         # exists; only kv/<key> is unwritable
    read_only(monkeypatch, sub)
    with pytest.warns(PrefixCacheWarning, match="read-only"):
        code, res, err = generate_cli(capsys, "--prefix-cache", str(d))
    assert code == 0 and res["token_ids"] == plain["token_ids"] and res["text"] == plain["text"]
    assert list(sub.iterdir()) == []


def test_read_only_cache_directory_is_read_not_written(tmp_path, monkeypatch):
    pc = make(tmp_path)
    pc.save(IDS, fake_cache(IDS))
    before = tree_digest(tmp_path)
    read_only(monkeypatch, tmp_path)
    with pytest.warns(PrefixCacheWarning, match="read-only") as rec:
        ro = make(tmp_path)
        c = empty_cache()
        assert ro.lookup_and_restore(IDS, c) == 40              # reading works
        other = list(range(500, 540))
        assert ro.save(other, fake_cache(other)) is None         # writing is skipped
        assert ro.verify()["valid"] == 1
    assert len([r for r in rec if "read-only" in str(r.message)]) == 1
    assert (c.k[:, :40] == fake_cache(IDS).k[:, :40]).all()
    monkeypatch.undo()
    assert tree_digest(tmp_path) == before


@pytest.mark.skipif(os.geteuid() == 0, reason="chmod does not stop root; the simulated case above covers it")
def test_read_only_cache_directory_by_chmod(tmp_path):
    pc = make(tmp_path)
    pc.save(IDS, fake_cache(IDS))
    for p in [tmp_path, *tmp_path.rglob("*")]:
        if p.is_dir():
            p.chmod(0o555)
    try:
        with pytest.warns(PrefixCacheWarning, match="read-only"):
            assert make(tmp_path).lookup_and_restore(IDS, empty_cache()) == 40
    finally:
        for p in [tmp_path, *tmp_path.rglob("*")]:
            if p.is_dir():
                p.chmod(0o755)


def _relabel(src: Path, dst: Path, old_key: str, new_key: str) -> None:
    """Copy a snapshot, editing the fingerprint in its header to another model's (same length)."""
    data = src.read_bytes()
    assert old_key.encode() in data
    dst.write_bytes(data.replace(old_key.encode(), new_key.encode()))


def test_snapshot_relabelled_with_this_models_fingerprint_is_not_restored(tmp_path):
    ids = IDS
    other = make(tmp_path / "b", fp="model-b")
    other_path = other.save(ids, _shifted(ids))
    mine = make(tmp_path / "a", fp="model-a")
    target = mine.subdir / other_path.name
    _relabel(other_path, target, other.key, mine.key)
    vr = PrefixCache(tmp_path / "a", fingerprint="model-a", block_size=4, repair=False).verify()
    assert vr["valid"] == 0 and len(vr["bad"]) == 1 and "header checksum" in vr["bad"][0]
    with pytest.warns(PrefixCacheWarning, match="header checksum"):
        assert mine.lookup_and_restore(ids, empty_cache()) == 0


def _shifted(ids):
    """The K/V another model would compute for ids: same shapes, other values."""
    c = fake_cache(ids)
    c.k += 1.0
    return c


# ---- weights: a flipped bit is one clear error at load; doctor fails closed ----------------------------------
MOE = ROOT / "data" / "models" / "tiny-moe"


def flip(path: Path, offset: int = -1) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A private LESSONKIT_HOME (the verified-hash memo and the converted models live there)."""
    h = tmp_path / "home"
    monkeypatch.setenv("LESSONKIT_HOME", str(h))
    return h


def test_flipped_bit_in_a_user_model_is_one_clear_error(tmp_path, home, capsys):
    from lessonkit.errors import LessonkitError
    from lessonkit.models.registry import load_model
    d = tmp_path / "mine"
    shutil.copytree(MOE, d)
    assert load_model(str(d)).weights_verified is True
    flip(d / "experts.safetensors")
    with pytest.raises(LessonkitError, match="experts.safetensors: MISMATCH"):
        load_model(str(d))
    assert main(["generate", "--model", str(d), "--prompt", "hi", "--max-new-tokens", "2"]) == 2
    err = capsys.readouterr().err
    assert "experts.safetensors" in err and "Traceback" not in err


def test_flipped_bit_in_a_registered_model_is_caught(tmp_path, home, monkeypatch):
    from lessonkit.models import registry
    from lessonkit.errors import LessonkitError
    models = tmp_path / "models"
    shutil.copytree(MOE, models / "tiny-moe")
    monkeypatch.setattr(registry, "MODELS_DIR", models)
    flip(models / "tiny-moe" / "dense.safetensors", 200)
    with pytest.raises(LessonkitError, match="dense.safetensors: MISMATCH"):
        registry.load_model("tiny-moe")
    (models / "tiny-moe" / "manifest.json").unlink()         # a shipped model without a manifest is refused too
    with pytest.raises(LessonkitError, match="manifest.json: missing"):
        registry.load_model("tiny-moe")


def test_converted_cache_is_checked_at_load(home):
    """The converted SmolLM2 cache is held to its manifest (a copy of tiny-moe stands in for the 515 MB)."""
    from lessonkit.models import registry
    from lessonkit.errors import LessonkitError
    d = registry.smollm2_cache_dir()
    shutil.copytree(MOE, d)
    assert registry.load_model("smollm2-135m").weights_verified is True
    flip(d / "experts.safetensors", 4096)
    with pytest.raises(LessonkitError, match="experts.safetensors: MISMATCH"):
        registry.load_model("smollm2-135m")


def test_a_clean_start_rehashes_nothing(tmp_path, home, monkeypatch):
    from lessonkit.models import integrity
    from lessonkit.models.integrity import check_model_files
    d = tmp_path / "m"
    shutil.copytree(MOE, d)
    calls = []
    real = integrity.sha256_file
    monkeypatch.setattr(integrity, "sha256_file", lambda p, *a: calls.append(Path(p).name) or real(p, *a))
    assert check_model_files(d) and len(calls) == 4
    assert check_model_files(d) and len(calls) == 4          # remembered by size, mtime, ctime, inode
    assert json.loads((home / "verified.json").read_text())
    flip(d / "tokenizer.json", 10)
    with pytest.raises(Exception, match="tokenizer.json: MISMATCH"):
        check_model_files(d)


@pytest.mark.parametrize("manifest,status", [
    ({"format_version": 1, "sha256": {}}, "lists no files"),
    ({"format_version": 1}, "lists no files"),
    ([1, 2], "lists no files"),
    ("not json", "unreadable"),
])
def test_doctor_fails_closed_on_empty_or_bad_manifests(tmp_path, manifest, status):
    from lessonkit.models.integrity import verify_manifest
    d = tmp_path / "m"
    shutil.copytree(MOE, d)
    (d / "manifest.json").write_text(manifest if isinstance(manifest, str) else json.dumps(manifest))
    res = verify_manifest(d)
    assert list(res) == ["manifest.json"] and status in res["manifest.json"]


def test_manifest_entries_outside_the_model_directory_are_refused(tmp_path, home):
    from lessonkit.files.safe_files import sha256_file
    from lessonkit.models.integrity import verify_manifest
    from lessonkit.errors import LessonkitError
    from lessonkit.models.registry import load_model
    d = tmp_path / "m"
    shutil.copytree(MOE, d)
    secret = tmp_path / "secret.txt"
    secret.write_text("outside")
    m = json.loads((d / "manifest.json").read_text())
    m["sha256"]["../secret.txt"] = sha256_file(secret)
    m["sha256"][str(secret)] = sha256_file(secret)
    (d / "manifest.json").write_text(json.dumps(m))
    res = verify_manifest(d)
    assert res["../secret.txt"].startswith("refused") and res[str(secret)].startswith("refused")
    with pytest.raises(LessonkitError, match="refused"):
        load_model(str(d))
    del m["sha256"]["dense.safetensors"]                       # a weight file the manifest forgot
    m["sha256"] = {k: v for k, v in m["sha256"].items() if "secret" not in k}
    (d / "manifest.json").write_text(json.dumps(m))
    assert verify_manifest(d)["dense.safetensors"].startswith("not listed")


def test_user_directory_without_manifest_loads_unverified(tmp_path, home):
    from lessonkit.models.integrity import model_integrity
    from lessonkit.models.registry import load_model
    d = tmp_path / "m"
    shutil.copytree(MOE, d)
    (d / "manifest.json").unlink()
    assert load_model(str(d)).weights_verified is False
    assert model_integrity(d, required=False)["manifest.json"].startswith("unverified")


def test_doctor_fails_on_a_broken_shipped_manifest(tmp_path, monkeypatch, home, capsys):
    from lessonkit.models import registry
    models = tmp_path / "models"
    for name in ("tiny-moe", "tiny-draft"):
        shutil.copytree(MOE.parent / name, models / name)
    (models / "tiny-draft" / "manifest.json").write_text(json.dumps({"format_version": 1, "sha256": {}}))
    monkeypatch.setattr(registry, "MODELS_DIR", models)
    assert main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "FAIL tiny-draft/manifest.json: lists no files" in out and "OK   tiny-moe/dense.safetensors: ok" in out


# ---- semantic cache: a flipped bit is never served; the audit's stop survives a restart -------------------------
def _unit(*lead):
    import numpy as np
    v = np.zeros(384, np.float32)
    v[: len(lead)] = lead
    return v / np.linalg.norm(v)


def test_flipped_bit_in_a_stored_embedding_is_never_served(tmp_path):
    import numpy as np
    from lessonkit.semcache.policies import make_policy, run_stream
    from lessonkit.semcache.store import CacheStore, SemcacheIntegrityWarning
    from lessonkit.semcache.judge import RuleJudge
    path = tmp_path / "cache.sqlite"
    s = CacheStore(path, "scope")
    cached = _unit(0, 1)
    s.put("cron job b on web-02 exited with code 0", cached, False)
    s.close()
    data = bytearray(path.read_bytes())
    at = data.find(cached.tobytes())
    assert at > 0 and data.find(cached.tobytes(), at + 1) < 0
    data[at + 3] ^= 0x40                       # component 0: 0.0 -> 2.0, cosine 2.0 with every "x" query
    path.write_bytes(bytes(data))
    queries = [f"disk usage on web-0{i} is at 97%" for i in range(5)]
    judge = RuleJudge({q: True for q in queries})
    with pytest.warns(SemcacheIntegrityWarning, match="1 semantic-cache entries fail their checksum"):
        store = CacheStore(path, "scope")
    assert store.bad_entries == [1] and len(store) == 0
    res = run_stream(queries, make_policy("one-sided", 0.9), judge,
                     embeddings=np.stack([_unit(1, 0.1 * i) for i in range(5)]), store=store)
    assert res.summary()["hits"] == 0 and res.summary()["actionable_losses"] == 0


def test_a_stopped_policy_stays_stopped_after_a_restart(tmp_path):
    import numpy as np
    from lessonkit.semcache.audit import AuditConfig
    from lessonkit.semcache.policies import make_policy, run_stream
    from lessonkit.semcache.store import CacheStore
    from lessonkit.semcache.judge import RuleJudge
    path = tmp_path / "cache.sqlite"
    b, b2, c, c_q, b_q = ("cron b ok", "cron b is ok", "disk c 40%", "disk c 95%", "cron b FAILED")
    judge = RuleJudge({b: False, b2: False, c: False, c_q: True, b_q: True})
    audit = AuditConfig(rate=0.0, first_n=1, limit=0.1)
    store = CacheStore(path, "scope")
    r1 = run_stream([b, b2, c, c_q], make_policy("one-sided", 0.8), judge, audit=audit, store=store,
                    embeddings=np.stack([_unit(1, 0, 0), _unit(1, 0.01, 0), _unit(0, 1, 0), _unit(0, 1, 0.01)]))
    assert r1.summary()["policy_stopped_at"] == 3 and r1.summary()["entries_retired"] == 1
    store.close()
    store = CacheStore(path, "scope")                          # restart: entry b is still live
    assert len([e for e in store.entries if store.usable(e)]) == 1
    r2 = run_stream([b_q], make_policy("one-sided", 0.8), judge, audit=audit, store=store,
                    embeddings=np.stack([_unit(1, 0, 0.01)]))
    s = r2.summary()
    assert s["hits"] == 0 and s["actionable_losses"] == 0 and s["policy_stopped_at"] == -1
    store.reset_policy(make_policy("one-sided", 0.8).describe())   # an operator's decision
    r3 = run_stream([b_q], make_policy("one-sided", 0.8), judge, audit=audit, store=store,
                    embeddings=np.stack([_unit(1, 0, 0.01)]))
    assert r3.summary()["hits"] == 1                           # serving again (and audited: a loss)


# ---- grammar: bounded memory, linear compile time, a clear error for nesting too deep ---------------------------
def _limited(code: str, *, mem_mb: int | None = None, cpu_s: int | None = None) -> subprocess.CompletedProcess:
    """Run code in a fresh interpreter under an address-space and/or CPU-time limit."""
    pre = "import resource\n"
    if mem_mb:
        pre += f"resource.setrlimit(resource.RLIMIT_AS, ({mem_mb << 20}, {mem_mb << 20}))\n"
    if cpu_s:
        pre += f"resource.setrlimit(resource.RLIMIT_CPU, ({cpu_s}, {cpu_s}))\n"
    return subprocess.run([sys.executable, "-c", pre + textwrap.dedent(code)], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_json_nested_ten_thousand_deep_fits_in_half_a_gigabyte(tmp_path):
    """Stacks copied per byte needed 5.6 GB for this 20 KB file (memory ~ depth squared)."""
    f = tmp_path / "deep.json"
    f.write_text("[" * 10_000 + "]" * 10_000)
    bad = tmp_path / "deep_bad.json"
    bad.write_text("[" * 10_000 + "]" * 9_999 + "}")
    r = _limited(f"""
        from lessonkit.cli import main
        raise SystemExit(main(["grammar", "check", "--grammar", "json", {str(f)!r}, {str(bad)!r}, "--json"]))
        """, mem_mb=512)
    assert "Traceback" not in r.stderr and "MemoryError" not in r.stderr, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert r.returncode == 1 and [x["ok"] for x in out["files"]] == [True, False]
    assert out["files"][1]["error_offset"] == 19_999


@pytest.mark.slow
def test_enum_of_200000_integers_compiles_in_linear_time():
    """A list-membership duplicate check and an O(position) line count per GBNF token made this
    quadratic (over 300 s); linear, it takes seconds. The CPU limit is a bound, not a speed target."""
    r = _limited("""
        from lessonkit.grammar.json_schema import schema_grammar
        g = schema_grammar({"enum": list(range(200_000)) + [7, 7]})
        assert g.matches(b"199999") and g.matches(b"7") and not g.matches(b"200000")
        print("ok")
        """, cpu_s=90)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


def _nested_schema(depth):
    s = {"type": "integer"}
    for _ in range(depth):
        s = {"type": "array", "items": s}
    return s


def _nested_const(depth):
    v = 1
    for _ in range(depth):
        v = [v]
    return {"const": v}


def _ref_chain(n):
    defs = {f"a{i}": {"$ref": f"#/$defs/a{i + 1}"} for i in range(n)}
    defs[f"a{n}"] = {"type": "integer"}
    return {"$defs": defs, "$ref": "#/$defs/a0"}


DEEP_SCHEMAS = {
    "items nested 2000 deep": (_nested_schema(2000), "nests too deep"),
    "const nested 5000 deep": (_nested_const(5000), "nests too deep"),
    "$ref chain 5000 long": (_ref_chain(5000), "nests too deep"),
    "regex groups 3000 deep": ({"type": "string", "pattern": "(" * 3000 + "a" + ")" * 3000}, "groups nest deeper"),
    "self reference": ({"$ref": "#"}, "$ref '#' is left-recursive"),
    "reference cycle": ({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
                        "left-recursive"),
    "const NaN": ({"const": float("nan")}, "NaN or Infinity"),
    "enum with Infinity": ({"enum": [1, float("inf")]}, "NaN or Infinity"),
    "NaN inside a const": ({"const": {"a": [float("nan")]}}, "NaN or Infinity"),
}


@pytest.mark.parametrize("name", list(DEEP_SCHEMAS))
def test_hostile_schema_is_one_clear_error(name):
    from lessonkit.errors import LessonkitError
    from lessonkit.grammar.json_schema import compile_schema, schema_grammar
    schema, message = DEEP_SCHEMAS[name]
    for fn in (compile_schema, schema_grammar):
        with pytest.raises(LessonkitError, match=re_escape(message)):
            fn(schema, source="s.json")


def re_escape(s):
    import re
    return re.escape(s)


@pytest.mark.parametrize("text,message", [
    ('{"const": NaN}', "NaN is not a JSON value"),
    ('{"enum": [1, -Infinity]}', "-Infinity is not a JSON value"),
    ('{"type":"array","items":' * 3000 + '{}' + '}' * 3000, "nests too deeply"),
])
def test_hostile_schema_file_via_the_cli(tmp_path, capsys, text, message):
    f = tmp_path / "s.json"
    f.write_text(text)
    doc = tmp_path / "x.json"
    doc.write_text("1")
    assert main(["grammar", "check", "--schema", str(f), str(doc)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize("gbnf,message", [
    ("root ::= " + "(" * 3000 + '"a"' + ")" * 3000, "groups nest deeper than 100"),
    ('root ::= "a"' + "*" * 3000, "quantifiers on one item"),
    ("root ::= " + "(" * 90 + '"a"' + "+" * 60 + ")" * 90, None),       # deep but allowed: it compiles
])
def test_deep_gbnf_is_one_clear_error(tmp_path, gbnf, message):
    from lessonkit.errors import LessonkitError
    from lessonkit.grammar.automaton import Grammar
    if message is None:
        assert Grammar(gbnf, "g.gbnf").matches(b"aaa")
        return
    with pytest.raises(LessonkitError, match=message):
        Grammar(gbnf, "g.gbnf")


# ---- bad values in a model's config.json: one error naming the file and the key ---------------------------------
@pytest.mark.parametrize("edit,message", [
    (lambda c: 42, "must be a JSON object of config keys, not int"),
    (lambda c: [c], "must be a JSON object of config keys, not list"),
    (lambda c: {**c, "n_kv_heads": 0}, "n_kv_heads must be a positive integer, got 0"),
    (lambda c: {**c, "dim": -256}, "dim must be a positive integer, got -256"),
    (lambda c: {**c, "n_layers": 2.5}, "n_layers must be a positive integer, got 2.5"),
    (lambda c: {**c, "head_dim": True}, "head_dim must be a positive integer"),
    (lambda c: {**c, "norm_eps": -1}, "norm_eps must be a finite positive number"),
    (lambda c: {**c, "eos_token_id": "x"}, "eos_token_id must be a token id"),
])
def test_bad_config_json_is_one_clear_error(tmp_path, home, capsys, edit, message):
    d = tmp_path / "m"
    shutil.copytree(MOE, d)
    (d / "manifest.json").unlink()                              # an unverified user directory: config is read
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps(edit(cfg)))
    assert main(["generate", "--model", str(d), "--prompt", "hi", "--max-new-tokens", "2"]) == 2
    err = capsys.readouterr().err
    assert str(d / "config.json") in err and message in err and "Traceback" not in err


# ---- more bad numbers on the command line (the generate/semcache ones are in test_bad_numbers) ------------------
@pytest.mark.parametrize("argv,option", [
    (["train", "tiny-draft", "--steps", "-1"], "--steps"),
    (["train", "tiny-draft", "--threads", "0"], "--threads"),
    (["gap", "--boot", "-5"], "--boot"),
    (["semcache", "run", "--audit-first", "-2"], "--audit-first"),
    (["semcache", "record", "--check", "-1"], "--check"),
    (["train-mtp", "--model", "tiny-moe", "--threads", "0"], "--threads"),
    (["mtp-doctor", "--model", "tiny-moe", "--windows", "0"], "--windows"),
])
def test_more_bad_numbers_are_refused_before_any_work(argv, option, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and option in err and "Traceback" not in err


# ---- symlinks and flipped bits through the command line --------------------------------------------------------
def test_clear_through_the_cli_changes_nothing_outside_the_cache(tmp_path, capsys):
    outside = tmp_path / "weights"
    shutil.copytree(MOE, outside)
    before = tree_digest(outside)
    d = tmp_path / "pc"
    assert generate_cli(capsys, "--prefix-cache", str(d))[0] == 0
    (sub,) = list((d / "kv").iterdir())
    (d / "kv" / "evil").symlink_to(outside, target_is_directory=True)
    os.symlink(outside / "dense.safetensors", sub / ("f" * 40 + ".safetensors"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for model in ("tiny-moe", "tiny-draft"):
            assert main(["prefix-cache", "clear", str(d), "--model", model, "--json"]) == 0
    capsys.readouterr()
    assert tree_digest(outside) == before
    assert not [p for p in sub.glob("*.safetensors") if not p.is_symlink()]    # its own snapshot is gone


def test_flipped_bit_in_a_snapshot_never_changes_the_output(tmp_path, capsys):
    code, plain, _ = generate_cli(capsys)
    d = tmp_path / "pc"
    assert generate_cli(capsys, "--prefix-cache", str(d))[0] == 0
    (snap,) = list((d / "kv").glob("*/*.safetensors"))
    flip(snap, -7)                                               # one bit of the V tensor
    with pytest.warns(PrefixCacheWarning, match="payload checksum"):
        code, res, _ = generate_cli(capsys, "--prefix-cache", str(d))
    assert code == 0 and res["token_ids"] == plain["token_ids"]
    code, warm, _ = generate_cli(capsys, "--prefix-cache", str(d))   # recomputed, saved and served again
    assert warm["token_ids"] == plain["token_ids"] and warm["stats"]["prefix_cache_hits"] > 0


SWEEP = [
    ["generate", "--model", "tiny-moe", "--prompt", "hi", "--temperature", "inf"],
    ["generate", "--model", "tiny-moe", "--prompt", "hi", "--stop", ""],
    ["generate", "--model", "tiny-moe", "--prompt", "hi", "--prefix-cache", "{tmp}/pc", "--grammar", "json"],
    ["generate", "--model", "{tmp}/no-such-model", "--prompt", "hi"],
    ["semcache", "run", "--limit", "-5"],
    ["grammar", "check", "--grammar", "json", "{tmp}/deep.json"],
    ["grammar", "check", "--grammar", "{tmp}/deep.gbnf", "{tmp}/deep.json"],
    ["grammar", "check", "--schema", "{tmp}/nan.json", "{tmp}/deep.json"],
    ["grammar", "compile", "{tmp}/self.json"],
    ["prefix-cache", "verify", "{tmp}/no-such-dir", "--model", "tiny-moe"],
]


@pytest.mark.slow
def test_the_sweep_in_a_fresh_process_prints_no_traceback(tmp_path):
    """The command line as a user runs it: every case ends in output or one error line, exit 0, 1 or 2."""
    (tmp_path / "deep.json").write_text("[" * 3000 + "]" * 3000)
    (tmp_path / "deep.gbnf").write_text("root ::= " + "(" * 500 + '"["' + ")" * 500)
    (tmp_path / "nan.json").write_text('{"const": NaN}')
    (tmp_path / "self.json").write_text('{"$ref": "#"}')
    cases = [[a.replace("{tmp}", str(tmp_path)) for a in argv] for argv in SWEEP]
    code = f"""
        import json, sys
        from lessonkit.cli import main
        codes = []
        for argv in {cases!r}:
            try:
                codes.append(main(argv))
            except SystemExit as e:
                codes.append(e.code)
        print(json.dumps(codes))
        """
    r = _limited(code, mem_mb=4096)
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    codes = json.loads(r.stdout.strip().splitlines()[-1])
    assert codes == [2, 2, 2, 2, 2, 0, 2, 2, 2, 2], (codes, r.stderr[-3000:])
