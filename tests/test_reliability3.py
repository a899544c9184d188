"""Reliability 3 (issue 45, items 1, 2, 3, 5 and 6): each test failed on the code before its fix.

The CLI cases run lessonkit.cli.main in-process: a LessonkitError is one line and exit 2."""
from __future__ import annotations

import json
import shutil
import struct
import tarfile
from pathlib import Path

import pytest

from lessonkit.cli import main

ROOT = Path(__file__).resolve().parents[1]
MOE = ROOT / "data" / "models" / "tiny-moe"


def one_error_line(capsys, *needles) -> str:
    err = capsys.readouterr().err
    errors = [ln for ln in err.splitlines() if ln.startswith("lessonkit: error:")]
    assert "Traceback" not in err and len(errors) == 1, err[-2000:]
    for n in needles:
        assert n in errors[0], errors[0]
    return errors[0]


def tree(d: Path) -> dict:
    return {str(p.relative_to(d)): (p.read_bytes() if p.is_file() else "dir") for p in sorted(d.rglob("*"))}


# ---- item 1: `prefix-cache clear` on a directory that holds no cache writes nothing there -------------------------
@pytest.mark.parametrize("content", ["empty", "a user's files"])
def test_clear_on_a_directory_without_a_cache_writes_nothing(tmp_path, capsys, content):
    d = tmp_path / "mine"
    d.mkdir()
    if content != "empty":
        (d / "notes.txt").write_text("my own notes\n", encoding="utf-8")
        (d / "sub").mkdir()
    before = tree(d)
    assert main(["prefix-cache", "clear", str(d), "--model", "tiny-moe"]) == 2
    one_error_line(capsys, str(d), "holds no prefix cache")
    assert tree(d) == before


def test_clear_on_a_real_cache_still_clears_it(tmp_path, capsys):
    pc = tmp_path / "pc"
    assert main(["generate", "--model", "tiny-moe", "--prompt", "The river keeps", "--max-new-tokens", "2",
                 "--json", "--prefix-cache", str(pc)]) == 0
    assert list((pc / "kv").rglob("*.safetensors"))
    capsys.readouterr()
    assert main(["prefix-cache", "clear", str(pc), "--model", "tiny-moe", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["entries"] == 0
    assert not list((pc / "kv").rglob("*.safetensors"))


# ---- items 2 and 3: a model directory without a manifest whose weights are not what config.json says ---------------
def _copy_without_manifest(tmp_path) -> Path:
    d = tmp_path / "model"
    shutil.copytree(MOE, d)
    (d / "manifest.json").unlink()
    return d


def _relabel(path: Path, tensor: str, dtype) -> None:
    """Store one tensor's float32 bits under another dtype's label (I32: the header says int32, the bytes are
    the float32 weights), the rest as they are."""
    import torch
    from safetensors.torch import load_file, save_file
    t = load_file(path)
    t[tensor] = t[tensor].float().view(dtype)
    save_file(t, path)


@pytest.mark.parametrize("tensor,dtype,label", [("layers.0.wq", "int32", "I32"), ("embed", "int32", "I32"),
                                               ("layers.3.router", "int32", "I32")])
def test_a_dense_tensor_of_a_dtype_the_config_does_not_expect_is_refused(tmp_path, capsys, tensor, dtype, label):
    import torch
    d = _copy_without_manifest(tmp_path)
    _relabel(d / "dense.safetensors", tensor, getattr(torch, dtype))
    code = main(["generate", "--model", str(d), "--prompt", "The river keeps", "--max-new-tokens", "2"])
    assert code == 2
    one_error_line(capsys, "dense.safetensors", tensor, label)


def test_more_layers_in_config_than_in_the_weights_names_n_layers_and_config_json(tmp_path, capsys):
    d = _copy_without_manifest(tmp_path)
    cfg = json.loads((d / "config.json").read_text(encoding="utf-8"))
    cfg["n_layers"] += 2
    (d / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
    assert main(["generate", "--model", str(d), "--prompt", "The river keeps", "--max-new-tokens", "2"]) == 2
    one_error_line(capsys, "n_layers", "config.json", f"{cfg['n_layers'] - 2} layers")


# ---- item 5: the judge's adapter, config and logs are written crash-safely ----------------------------------------
class _Lora:
    """What save_adapter needs of a LoraModel: its adapter tensors."""

    def __init__(self, seed: int):
        import torch
        g = torch.Generator().manual_seed(seed)
        self.tensors = {"layers.3.wq.lora_A": torch.randn(2, 256, generator=g),
                        "layers.3.wq.lora_B": torch.randn(256, 2, generator=g)}

    def adapter_tensors(self):
        return dict(self.tensors)


def _torn_writes(monkeypatch, crash_at: str):
    """Every way a file reaches the disk writes half its bytes and then the process 'dies' (raises) while
    writing crash_at: save_file, Path.write_text/write_bytes and the atomic helper's write_all."""
    import lessonkit.files.atomic as atomic
    import lessonkit.training.judge as jt

    class Died(BaseException):
        pass

    _writing = [None]
    real_save, real_write_text, real_write_all = jt.save_file, Path.write_text, atomic.write_all

    def save_file(tensors, path, metadata=None):
        tmp = Path(str(path) + ".whole")
        real_save(tensors, tmp, metadata=metadata)
        data = tmp.read_bytes()
        tmp.unlink()
        if Path(path).name == crash_at or _writing[0] == crash_at:
            Path(path).write_bytes(data[: len(data) // 2])
            raise Died(crash_at)
        Path(path).write_bytes(data)

    def write_text(self, text, *a, **kw):
        if self.name == crash_at:
            real_write_text(self, text[: len(text) // 2], *a, **kw)
            raise Died(crash_at)
        return real_write_text(self, text, *a, **kw)

    def write_all(fd, data):
        if _writing[0] == crash_at:
            real_write_all(fd, bytes(data)[: len(data) // 2])
            raise Died(crash_at)
        real_write_all(fd, data)

    real_atomic = atomic.atomic_write

    def atomic_write(path, data, **kw):
        _writing[0] = Path(path).name
        try:
            return real_atomic(path, data, **kw)
        finally:
            _writing[0] = None

    monkeypatch.setattr(jt, "save_file", save_file)
    monkeypatch.setattr(Path, "write_text", write_text)
    monkeypatch.setattr(atomic, "write_all", write_all)
    monkeypatch.setattr(atomic, "atomic_write", atomic_write)
    if hasattr(jt, "atomic_write"):
        monkeypatch.setattr(jt, "atomic_write", atomic_write)
    return Died


@pytest.mark.parametrize("crash_at", ["adapter.safetensors", "adapter.json", "judge.json", "train_log.json"])
def test_a_crash_while_saving_the_judge_leaves_every_file_whole(tmp_path, monkeypatch, crash_at):
    from lessonkit.training.judge import PRESETS, save_adapter
    cfg = PRESETS["tiny-moe"]
    out = tmp_path / "tiny-moe-judge"
    save_adapter(_Lora(1), cfg, {"losses": [1.0]}, out)
    old = tree(out)
    died = _torn_writes(monkeypatch, crash_at)
    with pytest.raises(died):
        save_adapter(_Lora(2), cfg, {"losses": [2.0] * 1000}, out)
    monkeypatch.undo()
    save_adapter(_Lora(2), cfg, {"losses": [2.0] * 1000}, tmp_path / "new")
    new = tree(tmp_path / "new")
    now = tree(out)
    assert set(now) == set(old), "a temporary file was left behind"
    for name, data in now.items():
        assert data in (old[name], new[name]), f"{name} is torn ({len(data)} bytes)"


# ---- item 6: unpacking llama.cpp's sources is safe on every Python 3.11 (tarfile's filter= came in 3.11.4) ---------
def _sdist(tmp_path, evil: str | None) -> Path:
    """A stand-in for the llama-cpp-python sdist: vendor/llama.cpp with a CMakeLists.txt, plus one hostile member."""
    import io
    from lessonkit.bench.bench_llamacpp import VERSION
    prefix = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/"
    out = tmp_path / "made" / f"llama_cpp_python-{VERSION}.tar.gz"
    out.parent.mkdir()

    def add(tar, name, data=b"", **kw):
        info = tarfile.TarInfo(prefix + name)
        for k, v in kw.items():
            setattr(info, k, v)
        info.size = len(data) if info.type == tarfile.REGTYPE else 0
        tar.addfile(info, io.BytesIO(data) if info.type == tarfile.REGTYPE else None)

    with tarfile.open(out, "w:gz") as tar:
        add(tar, "CMakeLists.txt", b"project(llama)\n")
        add(tar, "src", type=tarfile.DIRTYPE, mode=0o755)
        add(tar, "src/llama.cpp", b"int main() {}\n", mode=0o644)
        add(tar, "src/link.cpp", type=tarfile.SYMTYPE, linkname="llama.cpp")
        if evil == "dotdot":
            add(tar, "../../../escaped.txt", b"outside\n")
        elif evil == "symlink out":
            add(tar, "src/out", type=tarfile.SYMTYPE, linkname="../../../../victim")
        elif evil == "absolute symlink":
            add(tar, "src/abs", type=tarfile.SYMTYPE, linkname=str(tmp_path / "victim"))
        elif evil == "hard link out":
            add(tar, "src/hard", type=tarfile.LNKTYPE, linkname="/etc/hostname")
        elif evil == "fifo":
            add(tar, "src/pipe", type=tarfile.FIFOTYPE)
        elif evil == "setuid":
            add(tar, "src/tool", b"#!/bin/sh\n", mode=0o4777)
    return out


def _fetch(tmp_path, monkeypatch, evil, old_python: bool):
    import lessonkit.bench.bench_llamacpp as lc
    made = _sdist(tmp_path, evil)

    def pip_download(cmd, log, what):                   # stands in for `pip download`: puts the sdist in place
        d = Path(cmd[cmd.index("-d") + 1])
        d.mkdir(parents=True, exist_ok=True)
        shutil.copy(made, d / made.name)
    monkeypatch.setattr(lc, "_run_logged", pip_download)
    if old_python:                                      # Python 3.11.0-3.11.3: no filter= and no data_filter
        real = tarfile.TarFile.extractall

        def extractall(self, path=".", members=None, *, numeric_owner=False, **kw):
            if kw:
                raise TypeError(f"extractall() got an unexpected keyword argument {next(iter(kw))!r}")
            return real(self, path, members, numeric_owner=numeric_owner)
        monkeypatch.setattr(tarfile.TarFile, "extractall", extractall)
        for name in ("data_filter", "tar_filter"):     # (tarfile itself still uses the rest)
            monkeypatch.delattr(tarfile, name)
    root = tmp_path / "home"
    root.mkdir()
    return lc.fetch_sources(root, root / "build.log"), root


@pytest.mark.parametrize("old_python", [False, True], ids=["3.11.4+", "3.11.0-3"])
def test_the_sources_unpack_on_every_python_3_11(tmp_path, monkeypatch, old_python):
    src, root = _fetch(tmp_path, monkeypatch, None, old_python)
    assert (src / "CMakeLists.txt").read_bytes() == b"project(llama)\n"
    assert (src / "src" / "link.cpp").read_bytes() == b"int main() {}\n"
    assert sorted(p.name for p in root.iterdir()) == ["llama.cpp"]          # no partial or sdist left


@pytest.mark.parametrize("old_python", [False, True], ids=["3.11.4+", "3.11.0-3"])
@pytest.mark.parametrize("evil", ["dotdot", "symlink out", "absolute symlink", "hard link out", "fifo"])
def test_a_hostile_member_is_refused_on_every_python_3_11(tmp_path, monkeypatch, evil, old_python):
    from lessonkit.errors import LessonkitError
    (tmp_path / "victim").mkdir()
    with pytest.raises(LessonkitError, match="refusing to unpack member"):
        _fetch(tmp_path, monkeypatch, evil, old_python)
    assert not (tmp_path / "home" / "llama.cpp").exists() and not (tmp_path / "home" / "llama.cpp.partial").exists()
    assert not list(tmp_path.rglob("escaped.txt")) and list((tmp_path / "victim").iterdir()) == []


@pytest.mark.parametrize("old_python", [False, True], ids=["3.11.4+", "3.11.0-3"])
def test_setuid_bits_are_dropped_on_every_python_3_11(tmp_path, monkeypatch, old_python):
    import stat
    src, _ = _fetch(tmp_path, monkeypatch, "setuid", old_python)
    mode = (src / "src" / "tool").stat().st_mode
    assert not mode & (stat.S_ISUID | stat.S_IWGRP | stat.S_IWOTH)
