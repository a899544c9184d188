"""A persistent prefix-KV cache: resume a long prompt from disk, never from a wrong state.

Layout of a cache directory DIR (one snapshot format: lessonkit.prefix_cache.snapshot):

    DIR/.lock                          file lock (lessonkit.files.portable_io): one writer of the index at a time
    DIR/index.json                     an acceleration only: rebuilt from the files when stale
    DIR/kv/<fingerprint[:32]>/<token ids sha256[:40]>.safetensors

A prompt that shares only part of a saved prefix resumes from the deepest shared block (or the
exact end of a saved prompt). Crash safety: a snapshot is written to a temporary file in the same
directory, fsynced, renamed over its final name and the directory fsynced (lessonkit.files.atomic);
a reader sees a whole file or none. A corrupt, truncated or foreign file is reported in one warning
naming it, removed and recomputed (with repair=False, as `lessonkit prefix-cache verify` opens it,
nothing is removed: bad files are only listed). A directory this process cannot write is used
read-only: snapshots are read and verified, nothing is saved or removed, one warning says so. Nothing
follows a symlink out of the directory: a symlinked `.lock` (opened with safe_files.open_nofollow) or a
`kv/` leading outside makes the cache read-only, and the LRU touch skips symlinks. Readers take a shared
lock and writers an exclusive one; on Windows every lock is exclusive (readers take turns). With repair=False (`prefix-cache
info` and `verify`) nothing is written, not even the lock. A damaged index.json is rebuilt
(lessonkit.prefix_cache.index). Stats follow vLLM: prefix_cache_queries and prefix_cache_hits are
counted in tokens.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import time
import warnings
from pathlib import Path
from typing import Sequence

import torch

from lessonkit.files.atomic import TMP_PREFIX, is_dead_temp, replace, write_temp
from lessonkit.errors import LessonkitError
from lessonkit.files.portable_io import lock, touch_nofollow, unlock
from lessonkit.files.safe_files import leads_outside, open_nofollow
from lessonkit.prefix_cache.faults import PrefixCacheStats, PrefixCacheWarning, disk_full, read_only_error
from lessonkit.prefix_cache.index import read_index
from lessonkit.prefix_cache.snapshot import (DEFAULT_BLOCK_SIZE, DEFAULT_BUDGET_BYTES, FORMAT, FORMAT_VERSION,
                                             BadSnapshot, best_match, block_hashes, cache_key, dtype_name, encode_snapshot,
                                             load_from_file, load_snapshot, longest_prefix_match, read_header,
                                             root_hash, token_ids_sha256)


class PrefixCache:
    """A directory of prefix-KV snapshots shared by processes, with a byte budget and LRU eviction.

    PrefixCache(dir, engine): the key is derived from engine.fingerprint() and the expected shapes
    from engine.config. Without an engine (tests with fake tensors) pass fingerprint=... instead.
    """

    def __init__(self, directory, engine=None, *, budget_bytes: int = DEFAULT_BUDGET_BYTES,
                 block_size: int = DEFAULT_BLOCK_SIZE, fingerprint: str | None = None, fsync: bool = True,
                 repair: bool = True):
        if engine is None and fingerprint is None:
            raise LessonkitError("PrefixCache needs an engine or an explicit fingerprint")
        if block_size < 1:
            raise LessonkitError(f"block_size must be >= 1, got {block_size}")
        if budget_bytes <= 0:
            raise LessonkitError(f"budget_bytes must be > 0, got {budget_bytes}")
        self.dir = Path(directory)
        self.engine = engine
        self.key = cache_key(fingerprint if fingerprint is not None else engine.fingerprint())
        self.root = root_hash(self.key)
        self.block_size = block_size
        self.budget_bytes = int(budget_bytes)
        self.fsync = fsync
        self.stats = PrefixCacheStats()
        self.subdir = self.dir / "kv" / self.key[:32]
        self.repair = repair                # False: never remove a file, only list what is bad
        self.read_only = False
        self.found_bad: dict[str, str] = {}  # path -> reason, every unusable file seen
        self._lock_path = self.dir / ".lock"
        self._index_path = self.dir / "index.json"
        self._warned: set[str] = set()
        if self.dir.is_dir() and leads_outside(self.subdir, self.dir):
            self._go_read_only(f"{self.dir / 'kv'} leads outside it; nothing is created there")
        try:
            if repair and not self.read_only:   # verify and info (repair=False) create no directory
                self.subdir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            if not ((read_only_error(e) or disk_full(e)) and self.dir.is_dir()):
                raise LessonkitError(f"cannot create prefix cache directory {self.subdir}: {e.strerror}") from None
            self._go_read_only(e.strerror)
        with self._locked():
            if repair and not self.read_only:
                self._remove_stale_temps()
            self._write_index(self._load_index())

    def _go_read_only(self, why: str) -> None:
        """Use the cache read-only from now on (one warning): read and verify, never save or remove."""
        if not self.read_only:
            self.read_only = True
            warnings.warn(f"prefix cache {self.dir} is read-only ({why}): snapshots are read, "
                          f"nothing will be saved or removed", PrefixCacheWarning, stacklevel=3)

    # -- locking and the index ---------------------------------------------------------------------
    @contextlib.contextmanager
    def _locked(self):
        fd = self._open_lock()
        if fd is None:                      # read-only and no lock file: readers need no lock
            yield
            return
        try:
            lock(fd, shared=self.read_only or not self.repair)
            yield
        finally:
            unlock(fd)
            os.close(fd)

    def _open_lock(self) -> int | None:
        """The lock file's descriptor, never through a symlink (open_nofollow): a symlinked .lock makes the
        cache read-only. Only a cache that may write creates the lock (verify and info create nothing)."""
        if not self.read_only and self.repair:
            try:
                return open_nofollow(self._lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as e:
                if e.errno == errno.ELOOP:
                    self._go_read_only(f"{self._lock_path} is a symlink, not followed")
                elif not (read_only_error(e) or disk_full(e)):
                    raise LessonkitError(f"prefix cache: cannot open {self._lock_path}: {e.strerror}") from None
                self._go_read_only(e.strerror)
        try:
            return open_nofollow(self._lock_path, os.O_RDONLY)
        except OSError:
            return None

    def _remove_stale_temps(self) -> list[str]:
        """Temporary files of writers that died mid-save (their pid is gone, or older than a day)."""
        removed = []
        for p in [*self.dir.glob(f"{TMP_PREFIX}*.part"), *(self.dir / "kv").glob(f"*/{TMP_PREFIX}*.part")]:
            if is_dead_temp(p) and self._remove(p):
                removed.append(str(p))
        return removed

    def _snapshot_files(self) -> dict[str, os.stat_result]:
        out = {}
        for p in (self.dir / "kv").glob("*/*.safetensors"):
            with contextlib.suppress(OSError):
                out[str(p.relative_to(self.dir))] = p.stat()
        return out

    def _load_index(self) -> dict:
        """The index reconciled with the files on disk (call under the lock)."""
        entries = read_index(self._index_path, FORMAT_VERSION)     # missing or damaged: rebuilt below
        files = self._snapshot_files()
        out = {}
        for rel, st in files.items():
            e = entries.get(rel)
            if e is not None and e.get("bytes") == st.st_size:
                e["last_used"] = max(float(e.get("last_used", 0.0)), st.st_mtime)
                out[rel] = e
                continue
            mine = rel.startswith(str(self.subdir.relative_to(self.dir)) + os.sep)
            try:                                    # a file the index does not know: read its header
                h = read_header(self.dir / rel)
                if mine and h.get("fingerprint") != self.key:
                    raise BadSnapshot(f"foreign: written by another model/tokenizer/dtype (fingerprint "
                                       f"{str(h.get('fingerprint'))[:12]}..., expected {self.key[:12]}...)")
                out[rel] = {"fingerprint": h["fingerprint"], "n_tokens": int(h["n_tokens"]),
                            "block_size": int(h["block_size"]), "block_hashes": list(h["block_hashes"]),
                            "tail": list(h["tail"]), "bytes": st.st_size, "last_used": st.st_mtime,
                            "prefill_s": h.get("prefill_s")}
            except (BadSnapshot, OSError, KeyError, TypeError, ValueError) as err:
                if mine:
                    self._reject(self.dir / rel, str(err))
                else:                               # another model's namespace: counted, never matched
                    out[rel] = {"fingerprint": None, "n_tokens": 0, "block_size": 1, "block_hashes": [],
                                "tail": [], "bytes": st.st_size, "last_used": st.st_mtime}
        return out

    def _write_index(self, entries: dict, fsync: bool = False, strict: bool = False) -> None:
        if self.read_only or not self.repair:
            return                          # verify and read-only caches change nothing on disk
        data = json.dumps({"format_version": FORMAT_VERSION, "entries": entries}, sort_keys=True).encode()
        try:
            replace(write_temp(self.dir, data, fsync=fsync), self._index_path, fsync=fsync)
        except OSError as e:
            if read_only_error(e):
                self._go_read_only(e.strerror)
            elif strict and disk_full(e):
                raise
            elif str(self._index_path) not in self._warned:     # an acceleration only: rebuilt next time
                self._warned.add(str(self._index_path))
                warnings.warn(f"prefix cache: cannot write {self._index_path} ({e.strerror}); the index is "
                              f"rebuilt from the snapshot files", PrefixCacheWarning, stacklevel=3)

    def _remove(self, path: Path) -> bool:
        """Delete a file of this cache, never anything else: a path that leaves the cache directory
        (a symlinked kv/<key> entry, a `..` in an index entry) or that is itself a symlink is left alone."""
        if self.read_only or not self.repair:
            return False
        if not self._inside(path):
            warnings.warn(f"prefix cache: not removing {path}: it leads outside {self.dir}", PrefixCacheWarning,
                          stacklevel=3)
            return False
        with contextlib.suppress(OSError):
            path.unlink()
            return True
        return False

    def _inside(self, path: Path) -> bool:
        """A file of this cache: its directory leads inside the cache and it is not itself a symlink."""
        return not leads_outside(path.parent, self.dir) and not path.is_symlink()

    def _reject(self, path: Path, reason: str) -> None:
        """One warning naming the file; the file is removed so it is recomputed, never used (with
        repair=False it is only listed in found_bad, for verify's report)."""
        self.stats.ignored_bad += 1
        self.found_bad[str(path)] = reason
        if not self.repair:
            return
        removed = self._remove(path)
        if str(path) not in self._warned:
            self._warned.add(str(path))
            warnings.warn(f"prefix cache: ignoring {path}: {reason}; "
                          + ("removed, it will be recomputed" if removed else "left in place, never used"),
                          PrefixCacheWarning, stacklevel=3)

    # -- public API --------------------------------------------------------------------------------
    def entries(self) -> dict:
        with self._locked():
            return self._load_index()

    def total_bytes(self) -> int:
        return sum(e["bytes"] for e in self.entries().values())

    def _expected_shape(self, cache) -> tuple:
        if self.engine is not None and hasattr(self.engine, "config"):
            c = self.engine.config
            return (c.n_layers, c.n_kv_heads, c.head_dim)
        return (cache.k.shape[0], cache.k.shape[2], cache.k.shape[3])

    def lookup(self, token_ids: Sequence[int]) -> tuple[str | None, int]:
        """(relative path, estimated tokens) of the best saved snapshot for token_ids; no I/O of tensors."""
        with self._locked():
            entries = self._load_index()
        return best_match(entries, list(token_ids), self.key, self.root)

    def lookup_and_restore(self, token_ids: Sequence[int], cache, max_tokens: int | None = None) -> int:
        """Restore the longest saved prefix of token_ids into cache (a fresh KVCache); returns n restored.

        max_tokens caps the restore (generation restores at most len(prompt) - 1 tokens so that the
        last prompt token is forwarded and yields logits). On a miss the cache is left untouched.
        Every restored state is fully verified (format, fingerprint, shapes, dtype, payload hash,
        token ids); an unusable file is reported once, removed, and the next best one tried.
        """
        token_ids = [int(t) for t in token_ids]
        cap = len(token_ids) if max_tokens is None else max(0, min(int(max_tokens), len(token_ids)))
        self.stats.lookups += 1
        self.stats.prefix_cache_queries += len(token_ids)
        t0 = time.perf_counter()
        tried: set[str] = set()
        for _ in range(8):
            found = self._open_best(token_ids[:cap], tried)
            if found is None:
                return 0
            rel, f = found
            tried.add(rel)
            if f is None:
                continue
            snap = self._read_verified(rel, f, cache)
            if snap is None:
                continue
            n = self._restore(rel, snap, token_ids[:min(cap, cache.k.shape[1])], cache, t0)
            if n:
                return n
        return 0

    def _open_best(self, token_ids: list[int], tried: set) -> tuple[str, object] | None:
        """(relative path, open file or None if it vanished) of the best untried snapshot; None: no match.
        The file is opened under the lock, so an eviction cannot race the open."""
        with self._locked():
            entries = self._load_index()
            rel, est = best_match(entries, token_ids, self.key, self.root, exclude=tried)
            if rel is None or est == 0:
                return None
            try:
                return rel, open(self.dir / rel, "rb")
            except OSError:
                return rel, None

    def _read_verified(self, rel: str, f, cache) -> tuple[dict, dict, os.stat_result] | None:
        """(header, tensors, file stat) of a fully verified snapshot that fits cache; a bad one is
        reported and removed (only if nobody replaced it with a fresh file meanwhile) and None returned."""
        path = self.dir / rel
        st = os.fstat(f.fileno())
        try:
            with f:
                header, tensors = load_from_file(f, path, self.key)
                self._check_fits(header, tensors, cache)
        except BadSnapshot as err:
            with self._locked():
                try:
                    same = os.stat(path).st_ino == st.st_ino
                except OSError:
                    same = False
                if same:
                    self._reject(path, str(err))
            return None
        return header, tensors, st

    def _restore(self, rel: str, snap, token_ids: list[int], cache, t0: float) -> int:
        """Copy the snapshot's K/V for the tokens it shares with token_ids into cache; returns how many."""
        header, tensors, st = snap
        n = 0
        for a, b in zip(tensors["token_ids"].tolist(), token_ids):
            if a != b:
                break
            n += 1
        if n == 0:
            return 0
        cache.restore({"k": tensors["k"][:, :n], "v": tensors["v"][:, :n]})
        dt = time.perf_counter() - t0
        self.stats.restores += 1
        self.stats.prefix_cache_hits += n
        self.stats.restore_s += dt
        self.stats.bytes_read += st.st_size
        if header.get("prefill_s"):
            self.stats.prefill_s_saved += header["prefill_s"] * n / header["n_tokens"] - dt
        self._touch(rel, st.st_ino)
        return n

    def _check_fits(self, header: dict, tensors: dict, cache) -> None:
        k = tensors["k"]
        want = self._expected_shape(cache)
        got = (k.shape[0], k.shape[2], k.shape[3])
        if got != want:
            raise BadSnapshot(f"KV shape {tuple(k.shape)} does not match this model (layers, kv heads, head dim) = {want}")
        if k.dtype != cache.k.dtype or header.get("dtype") != dtype_name(cache.k.dtype):
            raise BadSnapshot(f"dtype {header.get('dtype')} does not match the cache dtype {dtype_name(cache.k.dtype)}")

    def _touch(self, rel: str, ino: int | None = None) -> None:
        """Mark as recently used (LRU): the file's mtime, which `_load_index` takes as its last use; the index
        entry only where the file could not be touched (re-reading and rewriting index.json on every restore took
        about a seventh of a restore's seconds)."""
        with self._locked():
            path = self.dir / rel
            with contextlib.suppress(OSError):
                if self._inside(path) and (ino is None or os.stat(path).st_ino == ino):
                    touch_nofollow(path)                        # never a file outside the cache
                    return
            entries = self._load_index()
            if rel in entries:
                entries[rel]["last_used"] = time.time()
                with contextlib.suppress(OSError):
                    self._write_index(entries)

    def save(self, token_ids: Sequence[int], cache, *, prefill_s: float | None = None) -> Path | None:
        """Save the KV state of token_ids (the first len(token_ids) positions of cache) atomically.

        Returns the file path, or None when the snapshot alone exceeds the byte budget or the cache is
        read-only (a directory this process may not write: one warning, nothing saved). Evicts the
        least recently used snapshots to stay within budget. A full disk raises LessonkitError and
        leaves the cache as it was.
        """
        token_ids = [int(t) for t in token_ids]
        n = len(token_ids)
        if n == 0 or self.read_only or not self.repair:
            return None
        if cache.length < n:
            raise LessonkitError(f"cannot save {n} tokens: the KV cache holds only {cache.length} positions")
        t0 = time.perf_counter()
        name = token_ids_sha256(token_ids)
        final = self.subdir / f"{name[:40]}.safetensors"
        rel = str(final.relative_to(self.dir))
        if self._refresh_if_saved(rel, final):
            return final
        hs = block_hashes(token_ids, self.block_size, self.root)
        entry, data = self._encode(token_ids, cache, name, hs, prefill_s)
        if len(data) > self.budget_bytes:
            return None
        tmp = self._write_snapshot(final, data)
        if tmp is None:
            return None
        self._commit(tmp, final, rel, entry)
        self.stats.saves += 1
        self.stats.bytes_written += len(data)
        self.stats.save_s += time.perf_counter() - t0
        return final

    def _refresh_if_saved(self, rel: str, final: Path) -> bool:
        """True (and marked recently used) when this exact prompt is already saved for this model."""
        with self._locked():
            entries = self._load_index()
            e = entries.get(rel)
            if e is not None and e.get("fingerprint") == self.key and e.get("block_size") == self.block_size:
                e["last_used"] = time.time()
                with contextlib.suppress(OSError):
                    if self._inside(final):
                        touch_nofollow(final)
                    self._write_index(entries)
                return True
        return False

    def _encode(self, token_ids: list[int], cache, name: str, hs: list[str], prefill_s) -> tuple[dict, bytes]:
        """(index entry, file bytes) of the snapshot of the first len(token_ids) positions of cache."""
        n = len(token_ids)
        snap = cache.snapshot(n)
        tensors = {"k": snap["k"], "v": snap["v"], "token_ids": torch.tensor(token_ids, dtype=torch.int64)}
        header = {"format": FORMAT, "format_version": FORMAT_VERSION, "fingerprint": self.key,
                  "n_tokens": n, "token_ids_sha256": name, "dtype": dtype_name(snap["k"].dtype),
                  "block_size": self.block_size, "block_hashes": hs, "tail": token_ids[len(hs) * self.block_size:],
                  "prefill_s": prefill_s, "created_unix": time.time(),
                  "model": getattr(self.engine, "name", None)}
        data = encode_snapshot(tensors, header)
        entry = {"fingerprint": self.key, "n_tokens": n, "block_size": self.block_size, "block_hashes": hs,
                 "tail": header["tail"], "bytes": len(data), "prefill_s": prefill_s}
        return entry, data

    def _write_snapshot(self, final: Path, data: bytes) -> Path | None:
        """The snapshot's bytes in a temporary file next to `final` (None: the directory is read-only,
        or a symlink out of the cache); a full disk is a clear error."""
        if leads_outside(self.subdir, self.dir):
            warnings.warn(f"prefix cache: not saving into {self.subdir}: it leads outside {self.dir}",
                          PrefixCacheWarning, stacklevel=3)
            return None
        try:
            return write_temp(self.subdir, data, fsync=self.fsync)
        except OSError as e:
            if read_only_error(e):
                self._go_read_only(e.strerror)
                return None
            if disk_full(e):
                raise LessonkitError(
                    f"prefix cache: no space left on the device writing {final} ({len(data):,} bytes); "
                    f"nothing was saved and the cache is unchanged") from None
            raise LessonkitError(f"prefix cache: cannot write {final}: {e.strerror}") from None

    def _commit(self, tmp: Path, final: Path, rel: str, entry: dict) -> None:
        """Under the lock: evict to make room, rename the snapshot into place, index it."""
        try:
            with self._locked():
                entries = self._load_index()
                self._evict(entries, entry["bytes"], keep=rel)
                replace(tmp, final, fsync=self.fsync)
                entries[rel] = {**entry, "last_used": time.time()}
                try:
                    self._write_index(entries, fsync=self.fsync, strict=True)
                except OSError as e:        # the snapshot is complete; the index is rebuilt next time
                    if disk_full(e):
                        raise LessonkitError(
                            f"prefix cache: no space left on the device updating {self._index_path}; "
                            f"the snapshot {final} is complete and the index will be rebuilt") from None
                    raise
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink()                # only still there if the rename did not happen

    def _evict(self, entries: dict, incoming: int, keep: str) -> None:
        total = sum(e["bytes"] for rel, e in entries.items() if rel != keep)
        for rel in sorted((r for r in entries if r != keep), key=lambda r: entries[r]["last_used"]):
            if total + incoming <= self.budget_bytes:
                break
            self._remove(self.dir / rel)
            total -= entries.pop(rel)["bytes"]
            self.stats.evictions += 1

    def clear(self) -> int:
        """Remove this model's snapshots (other models' entries stay); returns how many were removed."""
        with self._locked():
            entries = self._load_index()
            mine = [rel for rel, e in entries.items() if e.get("fingerprint") == self.key]
            removed = sum(self._remove(self.dir / rel) for rel in mine)
            self._write_index({rel: e for rel, e in entries.items() if rel not in mine})
        return removed

    def verify(self) -> dict:
        """Check every snapshot of this model fully. bad lists each unusable file with the reason
        (files found bad while reading the index included); with repair=False nothing is removed."""
        self.found_bad = {}
        with self._locked():
            entries = self._load_index()
            files = self._snapshot_files()
            temps = [str(p) for p in (self.dir / "kv").glob(f"*/{TMP_PREFIX}*.part")]
            ok = 0
            for rel, e in entries.items():
                if e.get("fingerprint") != self.key:
                    continue
                try:
                    load_snapshot(self.dir / rel, self.key)
                    ok += 1
                except (BadSnapshot, OSError) as err:
                    self.found_bad[str(self.dir / rel)] = str(err)
        bad = [f"{os.path.relpath(p, self.dir)}: {why}" for p, why in sorted(self.found_bad.items())]
        return {"valid": ok, "bad": bad, "temp_files": temps,
                "index_matches_files": set(entries) == set(files),
                "total_bytes": sum(e["bytes"] for e in entries.values())}

    def __repr__(self):
        return f"PrefixCache({str(self.dir)!r}, key={self.key[:12]}, budget={self.budget_bytes:,} B, block={self.block_size})"
