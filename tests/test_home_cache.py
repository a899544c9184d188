"""`lessonkit cache` (lessonkit.files.home_cache): the cache folder listed by kind with sizes; --clear removes only
the kinds named, only with --yes, never an unknown entry, never through a symlink, and a clear that fails half-way
leaves an entry no loader reads."""
import json
import os

import pytest

from lessonkit.errors import LessonkitError
from lessonkit.files import home_cache as hc


def _fill(home):
    (home / "models" / "m1").mkdir(parents=True)
    (home / "models" / "m1" / "w.bin").write_bytes(b"x" * 3000)
    (home / "llamacpp-0.3.36").mkdir()
    (home / "llamacpp-0.3.36" / "llama-bench").write_bytes(b"y" * 100)
    (home / "suffix").mkdir()
    (home / "suffix" / "s.suffix").write_bytes(b"z" * 10)
    (home / "verified.json").write_text("{}")
    (home / "my-notes").mkdir()                              # a folder lessonkit did not make
    (home / "my-notes" / "keep.txt").write_text("mine")


def test_the_listing_gives_each_entry_its_kind_and_size(tmp_path):
    _fill(tmp_path)
    rows = {r["name"]: r for r in hc.entries(tmp_path)}
    assert rows["models"]["kind"] == "models" and rows["models"]["bytes"] == 3000 and rows["models"]["files"] == 1
    assert rows["llamacpp-0.3.36"]["kind"] == "llamacpp" and rows["verified.json"]["kind"] == "memo"
    assert rows["my-notes"]["kind"] is None
    text = "\n".join(hc.report_lines(list(rows.values()), tmp_path))
    assert "unknown to lessonkit: never touched" in text and "2.9 KB" in text


def test_without_yes_nothing_is_removed(tmp_path):
    _fill(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    rows = hc.clear(["all"], yes=False, home=tmp_path)
    assert {r["done"] for r in rows} == {"would remove"}
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_a_clear_removes_the_kinds_named_and_nothing_else(tmp_path):
    _fill(tmp_path)
    rows = hc.clear(["models", "llamacpp"], yes=True, home=tmp_path)
    assert sorted(r["name"] for r in rows) == ["llamacpp-0.3.36", "models"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["my-notes", "suffix", "verified.json"]
    hc.clear(["all"], yes=True, home=tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["my-notes"]           # the unknown entry stays, whatever is asked
    assert (tmp_path / "my-notes" / "keep.txt").read_text() == "mine"


def test_a_symlink_is_never_followed_nor_removed(tmp_path):
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    home.mkdir()
    elsewhere.mkdir()
    (elsewhere / "precious.bin").write_bytes(b"p" * 500)
    os.symlink(elsewhere, home / "models")
    rows = hc.entries(home)
    assert rows[0]["symlink"] and rows[0]["bytes"] == 0
    out = hc.clear(["models"], yes=True, home=home)
    assert out[0]["done"].startswith("kept: a symlink")
    assert (home / "models").is_symlink() and (elsewhere / "precious.bin").read_bytes() == b"p" * 500


def test_an_unknown_kind_is_one_error_naming_the_known_ones(tmp_path):
    with pytest.raises(LessonkitError, match="cache kind 'model'.*models, converted"):
        hc.clear(["model"], yes=True, home=tmp_path)


def test_a_clear_that_fails_half_way_leaves_an_entry_no_loader_reads(tmp_path, monkeypatch):
    _fill(tmp_path)

    def fails(path, *a, **kw):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(hc.shutil, "rmtree", fails)
    with pytest.raises(LessonkitError, match=r"\.clearing-models: could not be removed"):
        hc.clear(["models"], yes=True, home=tmp_path)
    assert not (tmp_path / "models").exists() and (tmp_path / ".clearing-models").is_dir()
    assert hc.kind_of(".clearing-models") == "models"
    monkeypatch.undo()
    hc.clear(["models"], yes=True, home=tmp_path)                         # the next clear of the kind finishes it
    assert not (tmp_path / ".clearing-models").exists()


def test_the_command_lists_and_clears_under_lessonkit_home(tmp_path, monkeypatch, capsys):
    from lessonkit.cli import main
    _fill(tmp_path)
    monkeypatch.setenv("LESSONKIT_HOME", str(tmp_path))
    assert main(["cache", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["home"] == str(tmp_path) and {r["name"] for r in listed["rows"]} >= {"models", "my-notes"}
    assert main(["cache", "--clear", "suffix"]) == 0
    assert "add --yes" in capsys.readouterr().out and (tmp_path / "suffix").exists()
    assert main(["cache", "--clear", "suffix", "--yes"]) == 0
    assert "removed: suffix" in capsys.readouterr().out and not (tmp_path / "suffix").exists()
