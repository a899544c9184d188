"""Weight integrity: every model file is checked against its SHA-256 manifest before it is used.

A model directory's manifest.json lists `{"format_version": 1, "sha256": {file name: hex}}`. The rules:

* shipped models (data/models/<name>) and the converted SmolLM2 cache must have a manifest; a
  missing, unreadable or empty one, an entry that leaves the directory (`../x`, `/abs`, a symlink
  out) or a file whose bytes do not match is one LessonkitError naming the file, at load;
* a user's model directory without manifest.json is loaded, and `lessonkit doctor` or
  model_integrity() reports it "unverified" (nothing to check it against); with a manifest it is
  held to the same rules as a shipped model;
* a verified hash is remembered in $LESSONKIT_HOME/verified.json keyed by the file's resolved path,
  size, mtime_ns, ctime_ns and inode, so a clean start re-hashes nothing; any write to the file
  changes its ctime (which a user cannot set back), so an edited file is hashed again.
"""
from __future__ import annotations

import json
import os
import warnings
from pathlib import Path


from lessonkit.files.atomic import atomic_write
from lessonkit.errors import LessonkitError
from lessonkit.files.resources import lessonkit_home
from lessonkit.files.safe_files import load_json_file, require_regular, sha256_file  # noqa: F401 (re-exported)

MEMO_NAME = "verified.json"


def read_manifest(model_dir: Path) -> dict[str, str]:
    """{file name: sha256} of model_dir/manifest.json; raises LessonkitError when it is missing,
    unreadable or lists no file."""
    mpath = Path(model_dir) / "manifest.json"
    try:
        m = json.loads(require_regular(mpath).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise LessonkitError(f"{mpath}: missing (no SHA-256 manifest to check the weights against)") from None
    except LessonkitError as e:                 # not a regular file (a FIFO would block)
        raise LessonkitError(f"{mpath}: unreadable ({str(e).split(': ', 1)[-1]})") from None
    except (OSError, ValueError) as e:
        raise LessonkitError(f"{mpath}: unreadable ({e})") from None
    except RecursionError:
        raise LessonkitError(f"{mpath}: unreadable (nests too deeply)") from None
    files = m.get("sha256") if isinstance(m, dict) else None
    if not isinstance(files, dict) or not files:
        raise LessonkitError(f"{mpath}: lists no files (an empty manifest verifies nothing)")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
        raise LessonkitError(f"{mpath}: entries must map file names to SHA-256 hex strings")
    return files


def inside(model_dir: Path, name: str) -> Path | None:
    """model_dir/name when it names a file inside model_dir (no absolute path, no `..`, no symlink out)."""
    if os.path.isabs(name) or ".." in Path(name).parts:
        return None
    p = Path(model_dir) / name
    try:
        return p if p.resolve().is_relative_to(Path(model_dir).resolve()) else None
    except OSError:
        return None


def unlisted(model_dir: Path, files: dict) -> list[str]:
    """Weight, config and tokenizer files of model_dir that the manifest does not cover."""
    names = {p.name for p in Path(model_dir).glob("*.safetensors")} | {"config.json", "tokenizer.json"}
    return sorted(n for n in names if n not in files and (Path(model_dir) / n).is_file())


def _load_memo(path: Path) -> dict:
    """The remembered hashes; a damaged memo (not JSON, not an object, nested too deeply, not a regular
    file) is one warning and counts as empty: every file is hashed again and the memo rewritten."""
    if not path.exists():
        return {}
    try:
        memo = load_json_file(path, "hash memo")
        if not isinstance(memo, dict):
            raise LessonkitError(f"{path}: not a hash memo (not a JSON object)")
        return memo
    except LessonkitError as e:
        warnings.warn(f"{e}; ignored, the model files are hashed again", UserWarning, stacklevel=2)
        return {}


def _stat_key(p: Path) -> str:
    st = p.stat()
    return f"{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}"


def file_status(model_dir: Path, name: str, want: str, memo: dict) -> str:
    """'ok', 'MISMATCH', 'missing' or 'refused: ...' for one manifest entry (memo: verified hashes)."""
    p = inside(model_dir, name)
    if p is None:
        return "refused: the entry points outside the model directory"
    if not p.is_file():
        return "missing"
    real, key = str(p.resolve()), _stat_key(p)
    if memo.get(real) == [key, want]:
        return "ok"
    got = sha256_file(p)
    if got != want:
        return "MISMATCH"
    memo[real] = [key, want]
    return "ok"


def model_integrity(model_dir: str | Path, *, required: bool = True) -> dict[str, str]:
    """File -> 'ok' / 'MISMATCH' / 'missing' / 'refused: ...' / 'unverified' (what doctor prints).

    A directory without a manifest gives {"manifest.json": "missing"} (required) or "unverified"."""
    model_dir = Path(model_dir)
    if not required and not (model_dir / "manifest.json").exists():
        return {"manifest.json": "unverified (no manifest.json: loaded without a check)"}
    try:
        files = read_manifest(model_dir)
    except LessonkitError as e:
        return {"manifest.json": str(e).split(": ", 1)[-1]}
    memo_path = lessonkit_home() / MEMO_NAME
    memo = _load_memo(memo_path)
    n = len(memo)
    out = {f: file_status(model_dir, f, h, memo) for f, h in files.items()}
    for f in unlisted(model_dir, files):
        out[f] = "not listed in manifest.json (never checked)"
    if len(memo) != n:
        _save_memo(memo_path, memo)
    return out


def _save_memo(path: Path, memo: dict) -> None:
    """Atomically; a home we cannot write only costs a re-hash next time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps(memo, sort_keys=True).encode(), fsync=False)
    except OSError:
        pass


def refuse_special_files(model_dir: Path) -> None:
    """One LessonkitError naming the first model file (weights, config, tokenizer, manifest, ...) that
    exists but is not a regular file: reading a FIFO would block forever."""
    d = Path(model_dir)
    names = {"config.json", "tokenizer.json", "manifest.json", "borrow.json", "chat_template.jinja"}
    for p in sorted([*(d / n for n in names), *d.glob("*.safetensors")]):
        require_regular(p)


def check_model_files(model_dir: str | Path, *, required: bool = True) -> bool:
    """Raise one LessonkitError naming the first bad file; True when verified, False when unverified
    (a user directory without a manifest, allowed when not required)."""
    model_dir = Path(model_dir)
    refuse_special_files(model_dir)
    res = model_integrity(model_dir, required=required)
    for f, s in res.items():
        if s.startswith("unverified"):
            return False
        if s != "ok":
            hint = " (a flipped bit or an edit: restore the file, or re-create the model)" if s == "MISMATCH" else ""
            raise LessonkitError(f"{model_dir / f}: {s} against {model_dir / 'manifest.json'}{hint}")
    return True


def write_manifest(model_dir: str | Path, files: list[str] | None = None) -> dict:
    """manifest.json with the SHA-256 of the layout's files (or of `files`, names inside model_dir),
    written atomically."""
    from lessonkit.engine.checkpoint import FORMAT_VERSION, LAYOUT_FILES     # here: checking files needs no torch
    model_dir = Path(model_dir)
    files = {f: sha256_file(model_dir / f) for f in (files or LAYOUT_FILES) if (model_dir / f).exists()}
    m = {"format_version": FORMAT_VERSION, "sha256": files}
    atomic_write(model_dir / "manifest.json", (json.dumps(m, indent=2) + "\n").encode())
    return m


def verify_manifest(model_dir: str | Path) -> dict[str, str]:
    """File -> 'ok' / 'MISMATCH' / 'missing' / 'refused: ...' (used by `lessonkit doctor`); a missing,
    unreadable or empty manifest fails (lessonkit.models.integrity has the rules)."""
    return model_integrity(model_dir, required=True)
