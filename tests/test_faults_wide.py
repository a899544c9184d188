"""The second, wider fault sweep (issue 35, part A): nothing lost, nothing outside touched, no wrong
answer, one clear line. Each test failed on the code before its fix. The CLI cases run
lessonkit.cli.main in-process: a LessonkitError is one line and exit 2, anything else raises here."""
from __future__ import annotations

import errno
import json
import os
import shutil
import warnings
from pathlib import Path

import pytest

from lessonkit.cli import main
from test_faults import MOE, generate_cli, tree_digest

DEEP = "[" * 100_000 + "]" * 100_000


def one_clear_line(capsys, *needles) -> str:
    """stderr holds no traceback and exactly one error line (progress bars aside), naming each needle."""
    err = capsys.readouterr().err
    errors = [ln for ln in err.splitlines() if ln.startswith("lessonkit: error:")]
    assert "Traceback" not in err and len(errors) == 1, err[-2000:]
    for n in needles:
        assert n in errors[0], err
    return errors[0]


# ---- compare: a regression tool flags NaN and Infinity, and refuses what is not a summary -------------------
def _summary(tmp_path, name, figures=None, text=None) -> str:
    p = tmp_path / name
    p.write_text(text if text is not None else json.dumps({"lessons": {"01": {"figures": figures}}}))
    return str(p)


@pytest.mark.parametrize("old,new", [(1.0, float("nan")), (float("nan"), 1.0), (float("inf"), 1.0),
                                     (1.0, float("inf")), (float("-inf"), float("inf")), (5, float("-inf"))])
def test_compare_flags_a_figure_that_becomes_nan_or_leaves_infinity(tmp_path, capsys, old, new):
    a, b = _summary(tmp_path, "a.json", {"x": old, "y": 2.0}), _summary(tmp_path, "b.json", {"x": new, "y": 2.0})
    assert main(["compare", a, b]) == 1
    out = capsys.readouterr().out
    assert "01.x" in out and "01.y" not in out and "1 figure(s) moved" in out


def test_compare_keeps_unchanged_nan_and_infinity_quiet(tmp_path, capsys):
    figs = {"x": float("nan"), "y": float("inf"), "big": 10 ** 400}
    assert main(["compare", _summary(tmp_path, "a.json", figs), _summary(tmp_path, "b.json", figs)]) == 0
    assert "nothing moved" in capsys.readouterr().out


@pytest.mark.parametrize("text,message", [
    ("[1, 2]", "expected an object with a 'lessons' object"),
    ('{"lessons": [1]}', "expected an object with a 'lessons' object"),
    ('{"lessons": {"01": 3}}', "lesson '01' or its figures is not an object"),
    ('{"lessons": {"01": {"figures": [1]}}}', "lesson '01' or its figures is not an object"),
    (b'{"lessons": {"\xff": {}}}', "invalid UTF-8"),
    (DEEP, "nests too deeply"),
    ("{", "not a lessonkit summary.json"),
])
def test_compare_on_what_is_not_a_summary_is_one_clear_line(tmp_path, capsys, text, message):
    bad = tmp_path / "bad.json"
    bad.write_bytes(text if isinstance(text, bytes) else text.encode())
    good = _summary(tmp_path, "good.json", {"x": 1.0})
    assert main(["compare", good, str(bad)]) == 2
    one_clear_line(capsys, str(bad), message)


def test_compare_on_a_fifo_is_refused_without_blocking(tmp_path, capsys, alarm):
    fifo = tmp_path / "summary.json"
    os.mkfifo(fifo)
    assert main(["compare", str(fifo), _summary(tmp_path, "b.json", {"x": 1.0})]) == 2
    one_clear_line(capsys, "FIFO")


# ---- model files: a FIFO is refused naming it, an eos outside the vocabulary is refused -------------------
@pytest.fixture
def home(tmp_path, monkeypatch):
    h = tmp_path / "home"
    monkeypatch.setenv("LESSONKIT_HOME", str(h))
    return h


@pytest.fixture
def alarm():
    """Fail instead of hanging when something blocks (a FIFO opened for reading waits for a writer)."""
    import signal

    def boom(*_):
        raise TimeoutError("blocked: the FIFO was opened")
    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("name,manifest", [("dense.safetensors", False), ("dense.safetensors", True),
                                           ("experts.safetensors", False), ("tokenizer.json", False),
                                           ("config.json", False), ("manifest.json", True)])
def test_a_fifo_in_a_model_directory_is_refused_naming_it(tmp_path, home, capsys, alarm, name, manifest):
    d = tmp_path / "m"
    shutil.copytree(MOE, d)
    if not manifest:
        (d / "manifest.json").unlink()
    (d / name).unlink()
    os.mkfifo(d / name)
    assert main(["generate", "--model", str(d), "--prompt", "hi", "--max-new-tokens", "2"]) == 2
    one_clear_line(capsys, str(d / name), "FIFO")


def test_eos_token_id_outside_the_vocabulary_is_refused(tmp_path, home, capsys):
    d = tmp_path / "m"
    shutil.copytree(MOE, d)
    (d / "manifest.json").unlink()
    cfg = json.loads((d / "config.json").read_text())
    for eos in (10 ** 9, cfg["vocab_size"], [1, cfg["vocab_size"] + 5]):
        (d / "config.json").write_text(json.dumps({**cfg, "eos_token_id": eos}))
        assert main(["generate", "--model", str(d), "--prompt", "hi", "--max-new-tokens", "2"]) == 2
        one_clear_line(capsys, str(d / "config.json"), "eos_token_id must be a token id below vocab_size=4096")


@pytest.mark.parametrize("memo", [DEEP, "[1, 2]", "{", b"\xff\xfe"])
def test_a_damaged_verified_json_is_rebuilt_with_one_warning(tmp_path, home, memo):
    from lessonkit.models.registry import load_model
    d = tmp_path / "m"
    shutil.copytree(MOE, d)
    home.mkdir()
    (home / "verified.json").write_bytes(memo if isinstance(memo, bytes) else memo.encode())
    with pytest.warns(UserWarning, match="verified.json: not a hash memo"):
        assert load_model(str(d)).weights_verified is True
    assert isinstance(json.loads((home / "verified.json").read_text()), dict)     # rebuilt
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_model(str(d)).weights_verified is True


# ---- semantic cache: the retired flag and a stopped policy are inside a checksum; a read-only store -------
def _store(path):
    from lessonkit.semcache.store import CacheStore
    return CacheStore(path, "scope")


def _unit(*lead):
    import numpy as np
    v = np.zeros(384, np.float32)
    v[: len(lead)] = lead
    return v / np.linalg.norm(v)


def _sql(path, statement):
    import sqlite3
    db = sqlite3.connect(path)
    db.execute(statement)
    db.commit()
    db.close()


def test_an_un_retired_entry_is_never_served(tmp_path):
    from lessonkit.semcache.store import SemcacheIntegrityWarning
    path = tmp_path / "cache.sqlite"
    s = _store(path)
    kept, retired = s.put("disk c at 40%", _unit(1, 0), False), s.put("cron b ok", _unit(0, 1), False)
    s.retire(retired)
    s.close()
    s = _store(path)                                            # untouched: both load, one is retired
    assert len(s) == 2 and [s.usable(e) for e in s.entries] == [True, False] and not s.bad_entries
    s.close()
    _sql(path, f"UPDATE entries SET retired = 0 WHERE id = {retired.id}")     # the tamper
    with pytest.warns(SemcacheIntegrityWarning, match="1 semantic-cache entries fail their checksum"):
        s = _store(path)
    assert s.bad_entries == [retired.id] and [e.id for e in s.entries] == [kept.id]
    assert s.nearest(_unit(0, 1), 0.5) == [] and s.exact("cron b ok") is None


@pytest.mark.parametrize("tamper", ["stopped = 0", "losses = 0", "audits = 1000", "checksum = NULL"])
def test_a_tampered_policy_stop_keeps_the_policy_stopped(tmp_path, tamper):
    from lessonkit.semcache.policies import make_policy, run_stream
    from lessonkit.semcache.store import SemcacheIntegrityWarning
    from lessonkit.semcache.judge import RuleJudge
    path = tmp_path / "cache.sqlite"
    s = _store(path)
    s.put("cron b ok", _unit(1, 0), False)
    key = make_policy("one-sided", 0.8).describe()
    s.save_policy_state(key, 3, 2, True)
    s.close()
    assert _store(path).policy_state(key) == {"audits": 3, "losses": 2, "stopped": True}
    _sql(path, f"UPDATE policy_state SET {tamper}")
    s = _store(path)
    with pytest.warns(SemcacheIntegrityWarning, match="fails its checksum"):
        res = run_stream(["cron b is ok"], make_policy("one-sided", 0.8), RuleJudge({"cron b is ok": False}),
                         embeddings=_unit(1, 0.01)[None], store=s)
    assert res.summary()["hits"] == 0 and res.summary()["policy_stopped_at"] == -1


def _sqlite_read_only(monkeypatch, path):
    """SQLite opens a file it may not write read-only (root ignores chmod, so the test asks for that mode)."""
    import sqlite3
    real = sqlite3.connect

    def connect(p, *a, **k):
        if str(p) == str(path):
            return real(f"file:{p}?mode=ro", *a, uri=True, **k)
        return real(p, *a, **k)
    monkeypatch.setattr(sqlite3, "connect", connect)


def test_a_read_only_store_is_one_clear_line_before_the_run(tmp_path, monkeypatch, capsys):
    from lessonkit.errors import LessonkitError
    from lessonkit.semcache import policies
    path = tmp_path / "cache.sqlite"
    _store(path).close()
    before = path.read_bytes()
    _sqlite_read_only(monkeypatch, path)
    with pytest.raises(LessonkitError, match="cannot be written"):
        _store(path)
    monkeypatch.setattr(policies, "run_stream", lambda *a, **k: pytest.fail("the run started"))
    assert main(["semcache", "run", "--store", str(path), "--policy", "exact", "--judge", "rule", "--limit", "3"]) == 2
    one_clear_line(capsys, str(path), "cannot be written")
    assert path.read_bytes() == before


@pytest.mark.skipif(os.geteuid() == 0, reason="chmod does not stop root; the simulated case above covers it")
def test_a_read_only_store_by_chmod(tmp_path):
    from lessonkit.errors import LessonkitError
    path = tmp_path / "cache.sqlite"
    _store(path).close()
    path.chmod(0o444)
    with pytest.raises(LessonkitError, match="cannot be written"):
        _store(path)


# ---- prefix cache: nothing outside touched, inspection writes nothing, a damaged index is rebuilt -----------
def _pc_dir_with_one_snapshot(tmp_path, capsys) -> tuple[Path, dict, Path]:
    code, plain, _ = generate_cli(capsys)
    d = tmp_path / "pc"
    assert generate_cli(capsys, "--prefix-cache", str(d))[0] == 0
    (snap,) = list((d / "kv").glob("*/*.safetensors"))
    return d, plain, snap


def test_a_lock_symlinked_outside_is_not_created_there(tmp_path, capsys):
    code, plain, _ = generate_cli(capsys)
    d, outside = tmp_path / "pc", tmp_path / "outside"
    d.mkdir()
    outside.mkdir()
    (d / ".lock").symlink_to(outside / "victim.lock")            # the target does not exist
    from lessonkit.prefix_cache.cache import PrefixCacheWarning
    with pytest.warns(PrefixCacheWarning, match=r"\.lock is a symlink, not followed"):
        code, res, _ = generate_cli(capsys, "--prefix-cache", str(d))
    assert code == 0 and res["token_ids"] == plain["token_ids"]
    assert list(outside.iterdir()) == []


def test_a_kv_symlinked_outside_gets_nothing_created_in_its_target(tmp_path, capsys):
    code, plain, _ = generate_cli(capsys)
    d, outside = tmp_path / "pc", tmp_path / "outside"
    d.mkdir()
    outside.mkdir()
    (d / "kv").symlink_to(outside, target_is_directory=True)
    from lessonkit.prefix_cache.cache import PrefixCacheWarning
    with pytest.warns(PrefixCacheWarning, match="leads outside"):
        code, res, _ = generate_cli(capsys, "--prefix-cache", str(d))
    assert code == 0 and res["token_ids"] == plain["token_ids"]
    assert list(outside.iterdir()) == []


def test_a_snapshot_replaced_by_a_symlink_never_gets_its_target_touched(tmp_path, capsys):
    d, plain, snap = _pc_dir_with_one_snapshot(tmp_path, capsys)
    outside = tmp_path / "outside.bin"
    shutil.copyfile(snap, outside)                               # same size, same bytes: it verifies
    os.utime(outside, (1_000_000_000, 1_000_000_000))
    snap.unlink()
    snap.symlink_to(outside)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code, res, _ = generate_cli(capsys, "--prefix-cache", str(d))
    assert code == 0 and res["token_ids"] == plain["token_ids"]
    assert outside.stat().st_mtime == 1_000_000_000 and snap.is_symlink()


def test_prefix_cache_info_on_an_ordinary_directory_writes_nothing(tmp_path, capsys):
    d = tmp_path / "mine"
    d.mkdir()
    (d / "notes.txt").write_text("mine")
    for action in ("info", "verify"):
        assert main(["prefix-cache", action, str(d), "--model", "tiny-moe", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["dir"] == str(d)
        assert [p.name for p in d.iterdir()] == ["notes.txt"]


@pytest.mark.parametrize("damage", ["deep", "integer entries", "text last_used", "list of ints", "directory"])
def test_a_damaged_index_is_rebuilt_not_a_crash(tmp_path, capsys, damage):
    d, plain, snap = _pc_dir_with_one_snapshot(tmp_path, capsys)
    index = d / "index.json"
    data = json.loads(index.read_text())
    rel = str(snap.relative_to(d))
    if damage == "deep":
        index.write_text(DEEP)
    elif damage == "integer entries":
        index.write_text(json.dumps({**data, "entries": {rel: 7}}))
    elif damage == "text last_used":
        index.write_text(json.dumps({**data, "entries": {rel: {**data["entries"][rel], "last_used": "yesterday"}}}))
    elif damage == "list of ints":
        index.write_text(json.dumps({**data, "entries": {rel: {**data["entries"][rel], "block_hashes": [1, 2]}}}))
    else:
        index.unlink()
        index.mkdir()
    from lessonkit.prefix_cache.cache import PrefixCacheWarning
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        code, res, _ = generate_cli(capsys, "--prefix-cache", str(d))
    assert code == 0 and res["token_ids"] == plain["token_ids"] and res["stats"]["prefix_cache_hits"] > 0
    msgs = [str(r.message) for r in rec if issubclass(r.category, PrefixCacheWarning)]
    if damage == "directory":
        assert msgs and all("cannot write" in m and "index.json" in m for m in msgs) and index.is_dir()
    else:
        assert msgs == [] and json.loads(index.read_text())["entries"][rel]["bytes"] == snap.stat().st_size


def test_a_full_disk_at_start_up_is_a_warning_and_the_text(tmp_path, capsys, monkeypatch):
    from lessonkit.files import atomic
    from lessonkit.prefix_cache.cache import PrefixCacheWarning
    code, plain, _ = generate_cli(capsys)

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(atomic, "write_all", full)
    d = tmp_path / "pc"
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        code, res, err = generate_cli(capsys, "--prefix-cache", str(d))
    msgs = [str(r.message) for r in rec if issubclass(r.category, PrefixCacheWarning)]
    assert any("index.json (No space left on device)" in m for m in msgs), msgs          # at start-up
    assert code == 0 and res["token_ids"] == plain["token_ids"] and res["text"] == plain["text"]
    assert not (d / "index.json").exists() and not list(d.glob(".tmp-*"))


# ---- generate past the context: stop there, keep the text, say why -------------------------------------------
LONG = "The river keeps its own counsel. " * 84          # about 1,000 of tiny-moe's 1,024 positions


@pytest.mark.parametrize("extra", [[], ["--draft", "ngram"], ["--prefix-cache", "{tmp}/pc"]])
def test_max_new_tokens_past_the_context_keeps_the_text(tmp_path, capsys, extra):
    from lessonkit.models.registry import load_model
    eng = load_model("tiny-moe")
    room = eng.config.max_seq_len - len(eng.encode(LONG))
    assert 0 < room < 40
    argv = ["generate", "--model", "tiny-moe", "--prompt", LONG, "--json"]
    assert main(argv + ["--max-new-tokens", str(room)]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert plain["stats"]["finish_reason"] == "length" and len(plain["token_ids"]) == room
    extra = [a.replace("{tmp}", str(tmp_path)) for a in extra]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(argv + ["--max-new-tokens", "100000"] + extra) == 0
    out = capsys.readouterr()
    res = json.loads(out.out)
    assert res["token_ids"] == plain["token_ids"] and res["text"] == plain["text"]
    assert res["stats"]["finish_reason"] == "context"
    assert f"more than the {room} tokens left in tiny-moe's context of 1024" in out.err


def test_generate_stops_at_a_full_kv_cache_and_keeps_what_it_made():
    from lessonkit.engine.generate import generate
    from lessonkit.models.registry import load_model
    eng = load_model("tiny-moe")
    ids = eng.encode("The river keeps its own counsel")
    cache = eng.new_cache(64)
    res = generate(eng, ids, 1000, cache=cache, use_eos=False)
    assert res.stats["finish_reason"] == "context" and len(res.token_ids) == cache.max_len - len(ids) + 1
    assert res.token_ids == generate(eng, ids, len(res.token_ids), use_eos=False).token_ids


def test_a_prompt_longer_than_the_context_is_one_clear_line(capsys):
    assert main(["generate", "--model", "tiny-moe", "--prompt", LONG * 2, "--max-new-tokens", "4"]) == 2
    one_clear_line(capsys, "context holds 1024", "no room to generate")


# ---- export: never over the source, never over a user's files without --force, one line on write errors ------
def _export(*argv) -> int:
    return main(["export", *map(str, argv)])


def test_export_into_a_directory_holding_config_json_needs_force(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "config.json").write_text('{"mine": true}')
    (out / "notes.txt").write_text("mine")
    assert _export("tiny-moe", out) == 2
    one_clear_line(capsys, str(out), "already holds config.json", "--force")
    assert (out / "config.json").read_text() == '{"mine": true}' and sorted(p.name for p in out.iterdir()) == [
        "config.json", "notes.txt"]
    assert _export("tiny-moe", out, "--force") == 0
    assert json.loads((out / "config.json").read_text())["vocab_size"] == 4096
    assert (out / "notes.txt").read_text() == "mine" and (out / "model.safetensors").is_file()
    assert not list(out.glob(".export-*"))


@pytest.mark.parametrize("spelling", ["same", "dotdot", "symlink"])
def test_export_onto_its_own_source_is_refused_even_with_force(tmp_path, capsys, spelling):
    src = tmp_path / "copy"
    shutil.copytree(MOE, src)
    before = tree_digest(src)
    out = {"same": src, "dotdot": src / ".." / "copy", "symlink": tmp_path / "link"}[spelling]
    if spelling == "symlink":
        out.symlink_to(src, target_is_directory=True)
    for extra in ([], ["--force"]):
        assert _export(src, out, *extra) == 2
        one_clear_line(capsys, "is the model directory being exported")
    assert tree_digest(src) == before


def test_export_to_a_file_or_under_one_is_one_clear_line(tmp_path, capsys):
    f = tmp_path / "file.txt"
    f.write_text("mine")
    assert _export("tiny-moe", f) == 2
    one_clear_line(capsys, str(f), "is a file, not a directory")
    assert _export("tiny-moe", f / "sub") == 2
    one_clear_line(capsys, "cannot be created", "is a file")
    assert f.read_text() == "mine"


def test_export_to_a_read_only_directory_is_one_clear_line(tmp_path, capsys, monkeypatch):
    from test_faults import read_only
    out = tmp_path / "ro"
    out.mkdir()
    read_only(monkeypatch, out)
    assert _export("tiny-moe", out) == 2
    one_clear_line(capsys, f"cannot export to {out}", "Permission denied")
    monkeypatch.undo()
    assert list(out.iterdir()) == []


@pytest.mark.parametrize("exists", [False, True])
def test_export_on_a_full_disk_is_one_clear_line_and_leaves_nothing(tmp_path, capsys, monkeypatch, exists):
    from lessonkit.models import convert

    def full(tensors, path, metadata=None):
        Path(path).write_bytes(b"\0" * 1000)                    # a part written, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device", str(path))
    monkeypatch.setattr(convert, "save_file", full)
    out = tmp_path / "out"
    if exists:
        out.mkdir()
    assert _export("tiny-moe", out) == 2
    one_clear_line(capsys, f"cannot export to {out}", "No space left on device")
    assert (list(out.iterdir()) == []) if exists else not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == (["out"] if exists else [])


# ---- rule 2: a user's --out is kept, inspection commands write nothing, writes never go through a symlink -----
@pytest.mark.parametrize("argv", [["train-mtp", "--model", "tiny-moe", "--steps", "1"], ["corpus", "build"],
                                  ["train", "tiny-draft", "--steps", "1"]])
def test_an_existing_out_is_kept_without_force(tmp_path, capsys, monkeypatch, argv):
    from lessonkit import commands
    for name in ("cmd_train_mtp", "cmd_corpus_build", "cmd_train"):   # the refusal comes before any work
        monkeypatch.setattr(commands, name, lambda args: pytest.fail("the command ran"))
    for out in (tmp_path / "file.safetensors", tmp_path / "dir"):
        if out.suffix:
            out.write_bytes(b"mine")
        else:
            out.mkdir()
            (out / "mine.txt").write_text("mine")
        before = tree_digest(tmp_path)
        assert main(argv + ["--out", str(out)]) == 2
        one_clear_line(capsys, str(out), "already exists", "--force")
        assert tree_digest(tmp_path) == before


def test_refuse_overwrite_allows_a_new_or_empty_out_and_force(tmp_path):
    from lessonkit.errors import LessonkitError
    from lessonkit.files.safe_files import refuse_overwrite
    (tmp_path / "empty").mkdir()
    refuse_overwrite(tmp_path / "new", False)
    refuse_overwrite(tmp_path / "empty", False)
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    with pytest.raises(LessonkitError, match="already exists"):
        refuse_overwrite(tmp_path / "link", False)
    refuse_overwrite(tmp_path / "link", True)


def test_inspection_commands_write_nothing(tmp_path, capsys, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("LESSONKIT_HOME", str(home))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.json").write_text('{"type": "integer"}')
    (tmp_path / "x.json").write_text("12")
    summary = _summary(tmp_path, "summary.json", {"x": 1.0})
    pc = tmp_path / "pc"
    pc.mkdir()
    before, data_before = tree_digest(tmp_path), tree_digest(MOE)
    for argv in (["grammar", "check", "--schema", "s.json", "x.json"],
                 ["grammar", "compile", "s.json"], ["compare", summary, summary],
                 ["prefix-cache", "info", str(pc), "--model", "tiny-moe"],
                 ["prefix-cache", "verify", str(pc), "--model", "tiny-moe"]):
        assert main(argv) == 0, argv
    capsys.readouterr()
    mine = {k: v for k, v in tree_digest(tmp_path).items() if not k.startswith("home/")}   # the tool's own cache
    assert mine == before and sorted(p.name for p in tmp_path.iterdir() if p != home) == [
        "pc", "s.json", "summary.json", "x.json"] and list(pc.iterdir()) == []
    assert tree_digest(MOE) == data_before


def test_a_config_saved_over_a_symlink_replaces_the_link_not_its_target(tmp_path):
    from lessonkit.engine.config import ModelConfig
    outside = tmp_path / "outside.json"
    outside.write_text("mine")
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").symlink_to(outside)
    ModelConfig.load(MOE / "config.json").save(d / "config.json")
    assert outside.read_text() == "mine" and not (d / "config.json").is_symlink()
    assert ModelConfig.load(d / "config.json").vocab_size == 4096
