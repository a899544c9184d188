"""The prefix cache's index.json, an acceleration only: reading it never fails.

A damaged index (not UTF-8 JSON, nested too deeply, not an object, a FIFO or a directory in its
place) counts as missing, and a damaged entry (an integer, a non-numeric `last_used`, a list of the
wrong things) counts as unknown: the cache reads that snapshot's header again and rebuilds the entry.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from lessonkit.files.safe_files import special_file


def _count(v, lo: int = 0) -> bool:
    return type(v) is int and v >= lo


def _finite(v) -> bool:
    return type(v) in (int, float) and math.isfinite(v)


def valid_entry(e) -> bool:
    """True when e has every field of an index entry, each of the right type."""
    if not isinstance(e, dict):
        return False
    hashes, tail, prefill = e.get("block_hashes"), e.get("tail"), e.get("prefill_s")
    return ((e.get("fingerprint") is None or isinstance(e.get("fingerprint"), str))
            and _count(e.get("n_tokens")) and _count(e.get("block_size"), 1) and _count(e.get("bytes"))
            and isinstance(hashes, list) and all(isinstance(h, str) for h in hashes)
            and isinstance(tail, list) and all(_count(t) for t in tail)
            and _finite(e.get("last_used", 0.0)) and (prefill is None or _finite(prefill)))


def read_index(path: Path, format_version: int) -> dict:
    """{relative path: entry} of the valid entries of index.json at path; {} when it is missing or damaged."""
    if special_file(path) is not None:
        return {}
    try:
        data = json.loads(Path(path).read_bytes().decode("utf-8"))
    except (OSError, ValueError, RecursionError):       # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return {}
    if not isinstance(data, dict) or data.get("format_version") != format_version:
        return {}
    entries = data.get("entries")
    if not isinstance(entries, dict):
        return {}
    return {rel: e for rel, e in entries.items() if valid_entry(e)}


def holds_a_cache(directory: Path) -> bool:
    """True when directory has a prefix cache's own files (kv/, index.json or .lock, even damaged ones):
    `prefix-cache clear` writes only into such a directory, never into an ordinary one of the user's."""
    d = Path(directory)
    return any(p.exists() or p.is_symlink() for p in (d / "kv", d / "index.json", d / ".lock"))
