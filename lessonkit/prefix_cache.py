"""A persistent prefix-KV cache: resume a long prompt from disk, never from a wrong state.

A snapshot is the KV state of the first n tokens of a prompt, stored as one safetensors file
(tensors "k", "v" [n_layers, n, n_kv_heads, head_dim] and "token_ids" int64 [n]) whose metadata
holds a JSON header (format version, provenance fingerprint, token ids hash, n tokens, dtype, the
chained block hashes, a SHA-256 of the payload). Layout of a cache directory DIR:

    DIR/.lock                          fcntl.flock: one writer of the index at a time
    DIR/index.json                     an acceleration only: rebuilt from the files when stale
    DIR/kv/<fingerprint[:32]>/<token ids sha256[:40]>.safetensors

Provenance: the fingerprint is a SHA-256 over the weight file hashes, the tokenizer, the model
config, dtype, quantisation and the cache format version. Colibri's .coli_kv checks dimensions
and vocabulary only, so a cache written by other weights of the same shape is served silently.

Longest-prefix match uses chained block hashes in vLLM's style: h_i = H(h_{i-1}, tokens of block i),
with h_0 derived from the fingerprint, so a prompt that shares only part of a saved prefix resumes
from the deepest shared block (or the exact end of a saved prompt), and prefills the rest.

Crash safety: a snapshot is written to a temporary file in the same directory, fsynced, renamed
over its final name (os.replace) and the directory fsynced; a reader sees a whole file or none.
A corrupt, truncated or foreign file is reported in one warning naming it, removed and recomputed.
Stats follow vLLM: prefix_cache_queries and prefix_cache_hits are counted in tokens.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import math
import os
import struct
import sys
import time
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import torch

from lessonkit.engine.errors import LessonkitError

FORMAT = "lessonkit-prefix-kv"
FORMAT_VERSION = 1
META_KEY = "lessonkit_prefix_kv"
DEFAULT_BLOCK_SIZE = 16
DEFAULT_BUDGET_BYTES = 2 * 1024**3
HASH_HEX = 32                      # 128-bit block and name hashes (hex chars)
_CHUNK = 1 << 20                   # write in 1 MiB chunks
_TMP_PREFIX = ".tmp-"
_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I64": torch.int64,
           "I32": torch.int32, "U8": torch.uint8, "F64": torch.float64}
_DTYPE_NAMES = {v: k for k, v in _DTYPES.items()}


class PrefixCacheWarning(UserWarning):
    """A snapshot was found unusable (corrupt, truncated, foreign) and ignored."""


class _BadSnapshot(Exception):
    """Internal: why a file cannot be used."""


# ---- provenance ---------------------------------------------------------------------------------
def _canonical(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def file_sha256(path, chunk: int = 8 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(chunk)
            if not b:
                return h.hexdigest()
            h.update(b)


def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def fingerprint(weight_files, tokenizer_json, config_dict: Mapping, dtype, quant=None) -> str:
    """SHA-256 (hex) that keys the prefix cache: what must be equal for a KV state to be reusable.

    weight_files: paths to the weight files (each file's contents is hashed, keyed by its base
    name), or a mapping {file name: sha256 hex} (e.g. from a manifest). tokenizer_json: the text of
    tokenizer.json (str or bytes) or a pathlib.Path to it; it is canonicalised (key order and
    whitespace do not matter, any vocabulary/merge/normaliser change does). config_dict: the model
    config. dtype: the compute dtype (torch.dtype or name). quant: quantisation scheme (None, str or
    dict). The cache format version is included so a format change invalidates old snapshots.
    """
    if isinstance(weight_files, Mapping):
        weights = sorted((str(k), str(v)) for k, v in weight_files.items())
    else:
        weights = sorted((Path(p).name, file_sha256(p)) for p in weight_files)
    if not weights:
        raise LessonkitError("fingerprint needs at least one weight file")
    if isinstance(tokenizer_json, os.PathLike):
        tokenizer_json = Path(tokenizer_json).read_text(encoding="utf-8")
    if isinstance(tokenizer_json, bytes):
        tokenizer_json = tokenizer_json.decode("utf-8")
    if tokenizer_json is None:
        tok = None
    else:
        try:
            tok = _canonical(json.loads(tokenizer_json))
        except json.JSONDecodeError as e:
            raise LessonkitError(f"tokenizer_json is not valid JSON: {e}") from None
    record = {
        "cache_format": FORMAT, "cache_format_version": FORMAT_VERSION,
        "weights": weights,
        "tokenizer_sha256": None if tok is None else hashlib.sha256(tok.encode("utf-8")).hexdigest(),
        "config": json.loads(_canonical(dict(config_dict))),
        "dtype": _dtype_name(dtype),
        "quant": quant,
    }
    return hashlib.sha256(_canonical(record).encode("utf-8")).hexdigest()


def _cache_key(engine_fingerprint: str) -> str:
    """The engine's fingerprint combined with this cache's format version."""
    return hashlib.sha256(f"{FORMAT} v{FORMAT_VERSION}\0{engine_fingerprint}".encode()).hexdigest()


# ---- chained block hashes -------------------------------------------------------------------------
def _tokens_bytes(token_ids: Sequence[int]) -> bytes:
    return struct.pack(f"<{len(token_ids)}q", *token_ids)


def token_ids_sha256(token_ids: Sequence[int]) -> str:
    return hashlib.sha256(_tokens_bytes(token_ids)).hexdigest()


def root_hash(key: str) -> str:
    """h_0: the parent of the first block; derived from the fingerprint so models never share blocks."""
    return hashlib.sha256(f"prefix-root\0{key}".encode()).hexdigest()[:HASH_HEX]


def block_hashes(token_ids: Sequence[int], block_size: int = DEFAULT_BLOCK_SIZE, root: str = "") -> list[str]:
    """Chained hashes of the full blocks: h_i = sha256(h_{i-1} | tokens of block i) (vLLM style).

    Equal h_i means equal tokens [0, (i+1)*block_size) (barring a 128-bit collision); a partial last
    block gets no hash, as in vLLM.
    """
    if block_size < 1:
        raise LessonkitError(f"block_size must be >= 1, got {block_size}")
    out, parent = [], root
    for i in range(len(token_ids) // block_size):
        block = token_ids[i * block_size:(i + 1) * block_size]
        parent = hashlib.sha256(parent.encode() + b"|" + _tokens_bytes(block)).hexdigest()[:HASH_HEX]
        out.append(parent)
    return out


def longest_prefix_match(query_hashes: Sequence[str], saved: Mapping[str, Sequence[str]]) -> tuple[str | None, int]:
    """(name, depth): the saved entry sharing the most leading blocks with the query (0 if none).

    saved maps an entry name to its chained block hashes. Because hashes are chained, the query's
    block i matching an entry's block i implies every earlier block matches too, so the deepest
    match is found by looking up the query's hashes from the deepest down.
    """
    where: dict[str, str] = {}
    for name, hs in saved.items():
        for h in hs:
            where.setdefault(h, name)
    for depth in range(len(query_hashes), 0, -1):
        name = where.get(query_hashes[depth - 1])
        if name is not None:
            return name, depth
    return None, 0


# ---- the on-disk format ----------------------------------------------------------------------------
def _payload_sha256(tensors: Mapping[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        h.update(name.encode() + b"\0" + str(tuple(t.shape)).encode() + b"\0")
        h.update(memoryview(t.view(torch.uint8).reshape(-1).numpy()) if t.numel() else b"")
    return h.hexdigest()


def encode_snapshot(tensors: Mapping[str, torch.Tensor], header: dict) -> bytes:
    """Serialise tensors + header to safetensors bytes (the header goes in the metadata)."""
    from safetensors.torch import save
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    header = dict(header, payload_sha256=_payload_sha256(tensors))
    return save(tensors, metadata={META_KEY: json.dumps(header, sort_keys=True)})


def read_header(path) -> dict:
    """The JSON header of a snapshot file without reading its tensors (raises _BadSnapshot)."""
    with open(path, "rb") as f:
        return _parse_header(f, os.fstat(f.fileno()).st_size, path)[0]


def _parse_header(f, size: int, path) -> tuple[dict, dict, int]:
    raw = f.read(8)
    if len(raw) < 8:
        raise _BadSnapshot(f"truncated ({size} bytes, no safetensors header)")
    (n,) = struct.unpack("<Q", raw)
    if n > 100_000_000 or 8 + n > size:
        raise _BadSnapshot(f"truncated or not a safetensors file (header length {n}, file {size} bytes)")
    try:
        meta = json.loads(f.read(n))
        header = json.loads(meta["__metadata__"][META_KEY])
    except (ValueError, KeyError, TypeError):
        raise _BadSnapshot("no lessonkit prefix-KV header (not a snapshot, or edited header)") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise _BadSnapshot("not a lessonkit prefix-KV snapshot")
    if header.get("format_version") != FORMAT_VERSION:
        raise _BadSnapshot(f"format version {header.get('format_version')} (this lessonkit reads {FORMAT_VERSION})")
    end = 0
    for name, info in meta.items():
        if name == "__metadata__":
            continue
        try:
            end = max(end, int(info["data_offsets"][1]))
        except (KeyError, TypeError, ValueError, IndexError):
            raise _BadSnapshot(f"malformed tensor entry {name!r}") from None
    if 8 + n + end != size:
        raise _BadSnapshot(f"truncated: {size} bytes on disk, the header describes {8 + n + end}")
    return header, meta, 8 + n


def load_snapshot(path, expect_key: str | None = None) -> tuple[dict, dict[str, torch.Tensor]]:
    """Read and fully verify one snapshot file; raises _BadSnapshot with the reason."""
    with open(path, "rb") as f:
        return _load_from_file(f, path, expect_key)


def _load_from_file(f, path, expect_key: str | None):
    size = os.fstat(f.fileno()).st_size
    header, meta, data_start = _parse_header(f, size, path)
    if expect_key is not None and header.get("fingerprint") != expect_key:
        raise _BadSnapshot(f"foreign: written by another model/tokenizer/dtype (fingerprint "
                           f"{str(header.get('fingerprint'))[:12]}..., expected {expect_key[:12]}...)")
    buf = bytearray(size - data_start)
    f.seek(data_start)
    got = f.readinto(buf)
    if got != len(buf):
        raise _BadSnapshot(f"truncated while reading ({got} of {len(buf)} data bytes)")
    tensors = {}
    for name, info in meta.items():
        if name == "__metadata__":
            continue
        dt = _DTYPES.get(info.get("dtype"))
        if dt is None:
            raise _BadSnapshot(f"unknown dtype {info.get('dtype')!r} for {name!r}")
        a, b = info["data_offsets"]
        shape = tuple(info["shape"])
        t = torch.frombuffer(buf, dtype=torch.uint8, offset=a, count=b - a) if b > a else torch.empty(0, dtype=torch.uint8)
        if t.numel() != math.prod(shape) * torch.empty(0, dtype=dt).element_size():
            raise _BadSnapshot(f"tensor {name!r} size does not match its shape {shape}")
        tensors[name] = t.view(dt).reshape(shape)
    for need in ("k", "v", "token_ids"):
        if need not in tensors:
            raise _BadSnapshot(f"missing tensor {need!r}")
    if _payload_sha256(tensors) != header.get("payload_sha256"):
        raise _BadSnapshot("payload checksum mismatch (edited or damaged bytes)")
    ids = tensors["token_ids"]
    n = header.get("n_tokens")
    if ids.dim() != 1 or ids.shape[0] != n or tensors["k"].shape[1] != n or tensors["k"].shape != tensors["v"].shape:
        raise _BadSnapshot(f"shapes disagree with n_tokens={n}")
    if token_ids_sha256(ids.tolist()) != header.get("token_ids_sha256"):
        raise _BadSnapshot("token ids hash mismatch")
    return header, tensors


# ---- low-level crash-safe writes ---------------------------------------------------------------------
def _write_all(fd: int, data) -> None:
    """Write every byte (in chunks); the single place a test monkeypatches to simulate a full disk."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view[:_CHUNK])
        view = view[n:]


def _fsync_dir(path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _write_temp(directory: Path, data: bytes, fsync: bool = True) -> Path:
    """Write data to a new temporary file in directory (fsynced); removes it on any error."""
    tmp = directory / f"{_TMP_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}.part"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        _write_all(fd, data)
        if fsync:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(fd)
    return tmp


def _disk_full(e: OSError) -> bool:
    return e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ---- the cache ------------------------------------------------------------------------------------
@dataclass
class PrefixCacheStats:
    prefix_cache_queries: int = 0      # tokens looked up (vLLM counts tokens)
    prefix_cache_hits: int = 0         # tokens restored from disk
    lookups: int = 0
    restores: int = 0
    restore_s: float = 0.0
    prefill_s_saved: float = 0.0       # recorded prefill time of the restored tokens minus restore_s
    saves: int = 0
    save_s: float = 0.0
    bytes_written: int = 0
    bytes_read: int = 0
    evictions: int = 0
    ignored_bad: int = 0

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d["hit_rate"] = self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0
        return d


class PrefixCache:
    """A directory of prefix-KV snapshots shared by processes, with a byte budget and LRU eviction.

    PrefixCache(dir, engine): the key is derived from engine.fingerprint() and the expected shapes
    from engine.config. Without an engine (tests with fake tensors) pass fingerprint=... instead.
    """

    def __init__(self, directory, engine=None, *, budget_bytes: int = DEFAULT_BUDGET_BYTES,
                 block_size: int = DEFAULT_BLOCK_SIZE, fingerprint: str | None = None, fsync: bool = True):
        if engine is None and fingerprint is None:
            raise LessonkitError("PrefixCache needs an engine or an explicit fingerprint")
        if block_size < 1:
            raise LessonkitError(f"block_size must be >= 1, got {block_size}")
        if budget_bytes <= 0:
            raise LessonkitError(f"budget_bytes must be > 0, got {budget_bytes}")
        self.dir = Path(directory)
        self.engine = engine
        self.key = _cache_key(fingerprint if fingerprint is not None else engine.fingerprint())
        self.root = root_hash(self.key)
        self.block_size = block_size
        self.budget_bytes = int(budget_bytes)
        self.fsync = fsync
        self.stats = PrefixCacheStats()
        self.subdir = self.dir / "kv" / self.key[:32]
        try:
            self.subdir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise LessonkitError(f"cannot create prefix cache directory {self.subdir}: {e.strerror}") from None
        self._lock_path = self.dir / ".lock"
        self._index_path = self.dir / "index.json"
        self._warned: set[str] = set()
        with self._locked():
            self._remove_stale_temps()
            self._write_index(self._load_index())

    # -- locking and the index ---------------------------------------------------------------------
    @contextlib.contextmanager
    def _locked(self):
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def _remove_stale_temps(self) -> list[str]:
        """Temporary files of writers that died mid-save (their pid is gone, or older than a day)."""
        removed = []
        for p in [*self.dir.glob(f"{_TMP_PREFIX}*.part"), *(self.dir / "kv").glob(f"*/{_TMP_PREFIX}*.part")]:
            try:
                pid = int(p.name[len(_TMP_PREFIX):].split("-")[0])
                dead = not _pid_alive(pid) or time.time() - p.stat().st_mtime > 86400
            except (ValueError, OSError):
                dead = True
            if dead:
                with contextlib.suppress(OSError):
                    p.unlink()
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
        entries = {}
        try:
            data = json.loads(self._index_path.read_text())
            if data.get("format_version") == FORMAT_VERSION and isinstance(data.get("entries"), dict):
                entries = data["entries"]
        except (OSError, ValueError, AttributeError):
            pass                                    # missing or damaged index: rebuilt below
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
                    raise _BadSnapshot(f"foreign: written by another model/tokenizer/dtype (fingerprint "
                                       f"{str(h.get('fingerprint'))[:12]}..., expected {self.key[:12]}...)")
                out[rel] = {"fingerprint": h["fingerprint"], "n_tokens": int(h["n_tokens"]),
                            "block_size": int(h["block_size"]), "block_hashes": list(h["block_hashes"]),
                            "tail": list(h["tail"]), "bytes": st.st_size, "last_used": st.st_mtime,
                            "prefill_s": h.get("prefill_s")}
            except (_BadSnapshot, OSError, KeyError, TypeError, ValueError) as err:
                if mine:
                    self._reject(self.dir / rel, str(err))
                else:                               # another model's namespace: counted, never matched
                    out[rel] = {"fingerprint": None, "n_tokens": 0, "block_size": 1, "block_hashes": [],
                                "tail": [], "bytes": st.st_size, "last_used": st.st_mtime}
        return out

    def _write_index(self, entries: dict, fsync: bool = False) -> None:
        data = json.dumps({"format_version": FORMAT_VERSION, "entries": entries}, sort_keys=True).encode()
        tmp = _write_temp(self.dir, data, fsync=fsync)
        os.replace(tmp, self._index_path)
        if fsync:
            _fsync_dir(self.dir)

    def _reject(self, path: Path, reason: str) -> None:
        """One warning naming the file; the file is removed so it is recomputed, never used."""
        self.stats.ignored_bad += 1
        if str(path) not in self._warned:
            self._warned.add(str(path))
            warnings.warn(f"prefix cache: ignoring {path}: {reason}; removed, it will be recomputed",
                          PrefixCacheWarning, stacklevel=3)
        with contextlib.suppress(OSError):
            path.unlink()

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
        return self._best(entries, list(token_ids))

    def _best(self, entries: dict, token_ids: list[int], exclude=()) -> tuple[str | None, int]:
        mine = {rel: e for rel, e in entries.items() if e.get("fingerprint") == self.key and rel not in exclude}
        best, best_n = None, 0
        for bs in sorted({e["block_size"] for e in mine.values()}):
            group = {rel: e for rel, e in mine.items() if e["block_size"] == bs}
            q = block_hashes(token_ids, bs, self.root)
            _, depth = longest_prefix_match(q, {rel: e["block_hashes"] for rel, e in group.items()})
            for rel, e in group.items():     # entries sharing `depth` blocks; the tail may add a few tokens
                hs = e["block_hashes"]
                if depth and (len(hs) < depth or hs[depth - 1] != q[depth - 1]):
                    continue
                n = depth * bs
                if len(hs) == depth:
                    for t_saved, t_q in zip(e["tail"], token_ids[n:]):
                        if t_saved != t_q:
                            break
                        n += 1
                n = min(n, e["n_tokens"])
                if n > best_n or (n == best_n and n > 0 and e["last_used"] > entries[best]["last_used"]):
                    best, best_n = rel, n
        return best, best_n

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
            with self._locked():
                entries = self._load_index()
                rel, est = self._best(entries, token_ids[:cap], exclude=tried)
                if rel is None or est == 0:
                    return 0
                try:
                    f = open(self.dir / rel, "rb")   # open under the lock: eviction cannot race the open
                except OSError:
                    tried.add(rel)
                    continue
            tried.add(rel)
            path = self.dir / rel
            st = os.fstat(f.fileno())
            ino = st.st_ino
            try:
                with f:
                    header, tensors = _load_from_file(f, path, self.key)
                    self._check_fits(header, tensors, cache)
            except _BadSnapshot as err:
                with self._locked():
                    try:                        # only if nobody replaced it with a fresh file meanwhile
                        same = os.stat(path).st_ino == ino
                    except OSError:
                        same = False
                    if same:
                        self._reject(path, str(err))
                continue
            saved = tensors["token_ids"].tolist()
            n = 0
            for a, b in zip(saved, token_ids[:min(cap, cache.k.shape[1])]):
                if a != b:
                    break
                n += 1
            if n == 0:
                continue
            cache.restore({"k": tensors["k"][:, :n], "v": tensors["v"][:, :n]})
            dt = time.perf_counter() - t0
            self.stats.restores += 1
            self.stats.prefix_cache_hits += n
            self.stats.restore_s += dt
            self.stats.bytes_read += st.st_size
            if header.get("prefill_s"):
                self.stats.prefill_s_saved += header["prefill_s"] * n / header["n_tokens"] - dt
            self._touch(rel, ino)
            return n
        return 0

    def _check_fits(self, header: dict, tensors: dict, cache) -> None:
        k = tensors["k"]
        want = self._expected_shape(cache)
        got = (k.shape[0], k.shape[2], k.shape[3])
        if got != want:
            raise _BadSnapshot(f"KV shape {tuple(k.shape)} does not match this model (layers, kv heads, head dim) = {want}")
        if k.dtype != cache.k.dtype or header.get("dtype") != _dtype_name(cache.k.dtype):
            raise _BadSnapshot(f"dtype {header.get('dtype')} does not match the cache dtype {_dtype_name(cache.k.dtype)}")

    def _touch(self, rel: str, ino: int | None = None) -> None:
        """Mark as recently used (LRU): file mtime and index entry."""
        with self._locked():
            path = self.dir / rel
            with contextlib.suppress(OSError):
                if ino is None or os.stat(path).st_ino == ino:
                    os.utime(path)
            entries = self._load_index()
            if rel in entries:
                entries[rel]["last_used"] = time.time()
                with contextlib.suppress(OSError):
                    self._write_index(entries)

    def save(self, token_ids: Sequence[int], cache, *, prefill_s: float | None = None) -> Path | None:
        """Save the KV state of token_ids (the first len(token_ids) positions of cache) atomically.

        Returns the file path, or None when the snapshot alone exceeds the byte budget. Evicts the
        least recently used snapshots to stay within budget. A full disk raises LessonkitError and
        leaves the cache as it was.
        """
        token_ids = [int(t) for t in token_ids]
        n = len(token_ids)
        if n == 0:
            return None
        if cache.length < n:
            raise LessonkitError(f"cannot save {n} tokens: the KV cache holds only {cache.length} positions")
        t0 = time.perf_counter()
        name = token_ids_sha256(token_ids)
        final = self.subdir / f"{name[:40]}.safetensors"
        rel = str(final.relative_to(self.dir))
        hs = block_hashes(token_ids, self.block_size, self.root)
        with self._locked():
            entries = self._load_index()
            e = entries.get(rel)
            if e is not None and e.get("fingerprint") == self.key and e.get("block_size") == self.block_size:
                e["last_used"] = time.time()
                with contextlib.suppress(OSError):
                    os.utime(final)
                    self._write_index(entries)
                return final
        snap = cache.snapshot(n)
        tensors = {"k": snap["k"], "v": snap["v"], "token_ids": torch.tensor(token_ids, dtype=torch.int64)}
        header = {"format": FORMAT, "format_version": FORMAT_VERSION, "fingerprint": self.key,
                  "n_tokens": n, "token_ids_sha256": name, "dtype": _dtype_name(snap["k"].dtype),
                  "block_size": self.block_size, "block_hashes": hs, "tail": token_ids[len(hs) * self.block_size:],
                  "prefill_s": prefill_s, "created_unix": time.time(),
                  "model": getattr(self.engine, "name", None)}
        data = encode_snapshot(tensors, header)
        if len(data) > self.budget_bytes:
            return None
        try:
            tmp = _write_temp(self.subdir, data, fsync=self.fsync)
        except OSError as e:
            if _disk_full(e):
                raise LessonkitError(
                    f"prefix cache: no space left on the device writing {final} ({len(data):,} bytes); "
                    f"nothing was saved and the cache is unchanged") from None
            raise LessonkitError(f"prefix cache: cannot write {final}: {e.strerror}") from None
        try:
            with self._locked():
                entries = self._load_index()
                self._evict(entries, len(data), keep=rel)
                os.replace(tmp, final)
                if self.fsync:
                    _fsync_dir(self.subdir)
                entries[rel] = {"fingerprint": self.key, "n_tokens": n, "block_size": self.block_size,
                                "block_hashes": hs, "tail": header["tail"], "bytes": len(data),
                                "last_used": time.time(), "prefill_s": prefill_s}
                try:
                    self._write_index(entries, fsync=self.fsync)
                except OSError as e:        # the snapshot is complete; the index is rebuilt next time
                    if _disk_full(e):
                        raise LessonkitError(
                            f"prefix cache: no space left on the device updating {self._index_path}; "
                            f"the snapshot {final} is complete and the index will be rebuilt") from None
                    raise
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink()                # only still there if the rename did not happen
        self.stats.saves += 1
        self.stats.bytes_written += len(data)
        self.stats.save_s += time.perf_counter() - t0
        return final

    def _evict(self, entries: dict, incoming: int, keep: str) -> None:
        total = sum(e["bytes"] for rel, e in entries.items() if rel != keep)
        for rel in sorted((r for r in entries if r != keep), key=lambda r: entries[r]["last_used"]):
            if total + incoming <= self.budget_bytes:
                break
            with contextlib.suppress(OSError):
                (self.dir / rel).unlink()
            total -= entries.pop(rel)["bytes"]
            self.stats.evictions += 1

    def clear(self) -> None:
        with self._locked():
            for rel in self._load_index():
                with contextlib.suppress(OSError):
                    (self.dir / rel).unlink()
            self._write_index({})

    def verify(self) -> dict:
        """Check every snapshot of this model fully; report problems (does not remove anything)."""
        with self._locked():
            entries = self._load_index()
            files = self._snapshot_files()
            temps = [str(p) for p in (self.dir / "kv").glob(f"*/{_TMP_PREFIX}*.part")]
            bad, ok = [], 0
            for rel, e in entries.items():
                if e.get("fingerprint") != self.key:
                    continue
                try:
                    load_snapshot(self.dir / rel, self.key)
                    ok += 1
                except (_BadSnapshot, OSError) as err:
                    bad.append(f"{rel}: {err}")
        return {"valid": ok, "bad": bad, "temp_files": temps,
                "index_matches_files": set(entries) == set(files),
                "total_bytes": sum(e["bytes"] for e in entries.values())}

    def __repr__(self):
        return f"PrefixCache({str(self.dir)!r}, key={self.key[:12]}, budget={self.budget_bytes:,} B, block={self.block_size})"


# ---- engine integration: batch scoring behind one shared prefix ----------------------------------------
@dataclass
class ScoreResult:
    """Per item: log p(item tokens | prefix, earlier item tokens), and the logits after the item.

    logprobs[i] = sum of token_logprobs[i]; last_logits[i] is the next-token distribution after
    prefix + item i (float32 [V]). stats: mode (off / cold / warm), total_s, ttft_s (time until the
    first item is scored), prefill_s (prefix prefill actually run), restore_s, prefix_cache_queries
    and prefix_cache_hits (tokens), prefill_s_saved, save_s.
    """
    logprobs: list[float]
    token_logprobs: list[torch.Tensor]
    last_logits: torch.Tensor
    stats: dict = field(default_factory=dict)


def _rows_to_scores(rows: torch.Tensor, item: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """rows [L+1, V]: logits at the last prefix position and at each item position."""
    lp = torch.log_softmax(rows[:-1], dim=-1)
    tok = lp.gather(1, torch.tensor(list(item), dtype=torch.long)[:, None])[:, 0] if len(item) else lp.new_zeros(0)
    return tok, rows[-1].clone()


def score(engine, prefix_ids: Sequence[int], items: Sequence[Sequence[int]], *, prefix_cache: PrefixCache | None = None,
          progress: bool = False) -> ScoreResult:
    """Score many items behind one shared prefix (a long system prompt, an instruction, few-shot examples).

    prefix_cache=None: the cache is off, every item pays a fresh prefill of the prefix (each request
    on its own, as without prefix caching). With a PrefixCache: the prefix is restored from disk if
    saved (warm), else prefilled once and saved (cold); then each item runs from the shared state.
    Scores are bit-identical in all modes: the restored K/V are the bytes the prefill wrote, and
    every mode prefills the prefix in the same chunks (all but its last token, then the last token
    together with the item), so each item runs the same computation with or without the cache.
    """
    prefix_ids = [int(t) for t in prefix_ids]
    items = [[int(t) for t in it] for it in items]
    P = len(prefix_ids)
    if P < 1:
        raise LessonkitError("score needs a prefix of at least one token")
    if not items:
        raise LessonkitError("score needs at least one item")
    max_len = P + max(len(it) for it in items) + 1
    base = prefix_ids[:-1]                  # the shared state: all but the last prefix token
    st = {"mode": "off" if prefix_cache is None else "cold", "items": len(items), "prefix_tokens": P,
          "item_tokens": sum(len(it) for it in items), "prefill_s": 0.0, "restore_s": 0.0, "save_s": 0.0,
          "prefix_cache_queries": 0, "prefix_cache_hits": 0, "prefill_s_saved": 0.0, "ttft_s": None}
    before = prefix_cache.stats.as_dict() if prefix_cache is not None else None
    t_start = time.perf_counter()
    cache = None
    if prefix_cache is not None:
        cache = engine.new_cache(max_len)
        n = prefix_cache.lookup_and_restore(base, cache) if base else 0
        if n < len(base):
            t0 = time.perf_counter()
            engine.forward(base[n:], cache, last_only=True)
            st["prefill_s"] += time.perf_counter() - t0
        st["mode"] = "warm" if n else "cold"
    tok_lps, lasts = [], []
    bar = _progress(items, progress, f"score ({st['mode']})")
    for i, item in enumerate(bar):
        if prefix_cache is None:
            cache = engine.new_cache(max_len)
            if base:
                t0 = time.perf_counter()
                engine.forward(base, cache, last_only=True)
                st["prefill_s"] += time.perf_counter() - t0
        else:
            cache.rollback(len(base))
        rows = engine.forward([prefix_ids[-1]] + item, cache)
        tok, last = _rows_to_scores(rows, item)
        tok_lps.append(tok)
        lasts.append(last)
        if i == 0:
            st["ttft_s"] = time.perf_counter() - t_start
            if prefix_cache is not None and st["mode"] == "cold":
                t0 = time.perf_counter()
                prefix_cache.save(prefix_ids, cache, prefill_s=st["prefill_s"])
                st["save_s"] = time.perf_counter() - t0
    st["total_s"] = time.perf_counter() - t_start
    if prefix_cache is not None:
        after = prefix_cache.stats.as_dict()
        for k in ("prefix_cache_queries", "prefix_cache_hits", "restore_s", "prefill_s_saved"):
            st[k] = after[k] - before[k]
    return ScoreResult([float(t.sum()) for t in tok_lps], tok_lps, torch.stack(lasts), st)


def _progress(it, on: bool, desc: str):
    if not on:
        return it
    from tqdm.auto import tqdm
    return tqdm(it, desc=desc, leave=False)


def results_identical(a: ScoreResult, b: ScoreResult) -> bool:
    """Bit-identical scores (==, float32) for every item."""
    return (len(a.token_logprobs) == len(b.token_logprobs)
            and all(torch.equal(x, y) for x, y in zip(a.token_logprobs, b.token_logprobs))
            and torch.equal(a.last_logits, b.last_logits))


# ---- generation with a prefix cache ----------------------------------------------------------------------
def generate_with_prefix_cache(engine, prompt_ids: Sequence[int], prefix_cache, **gen_kwargs):
    """lessonkit.engine.generate.generate(), resuming the prompt from the prefix cache and saving it after.

    prefix_cache: a PrefixCache, or a directory (as `lessonkit generate --prefix-cache DIR` gives).
    Restores at most len(prompt) - 1 tokens (the last prompt token is forwarded to get logits),
    runs generate() on the resumed cache, then saves the prompt's KV state if it was not already
    covered. Adds prefix_cache_queries / prefix_cache_hits (tokens), restore_s, prefill_s_saved,
    ttft_s (from the call, restore included) and total_s to the result's stats.

    Exactness: a resumed prompt continues from exactly the state a fresh prefill of the same chunks
    computes (the saved prompt, then the rest). Versus one single forward over the whole prompt, the
    engine's GEMM results can depend on chunk boundaries in the last bits (see lessonkit.engine.model).
    """
    from lessonkit.engine.generate import generate
    prompt_ids = [int(t) for t in prompt_ids]
    if prefix_cache is None:
        return generate(engine, prompt_ids, **gen_kwargs)
    if not isinstance(prefix_cache, PrefixCache):
        prefix_cache = PrefixCache(prefix_cache, engine)
    if not prompt_ids:
        raise LessonkitError("generate needs a non-empty prompt")
    t_start = time.perf_counter()
    before = prefix_cache.stats.as_dict()
    max_new = int(gen_kwargs.get("max_new_tokens", 0) or 0)
    cache = gen_kwargs.pop("cache", None) or engine.new_cache(len(prompt_ids) + max_new + 1)
    n = prefix_cache.lookup_and_restore(prompt_ids, cache, max_tokens=len(prompt_ids) - 1)
    first = {}
    user_cb = gen_kwargs.pop("callback", None)

    def callback(*a, **k):
        first.setdefault("t", time.perf_counter())
        return user_cb(*a, **k) if user_cb is not None else None

    res = generate(engine, prompt_ids, cache=cache, callback=callback, **gen_kwargs)
    after = prefix_cache.stats.as_dict()
    if n < len(prompt_ids) - 1 and cache.length >= len(prompt_ids):
        prefix_cache.save(prompt_ids, cache, prefill_s=(res.stats or {}).get("ttft_s") if n == 0 else None)
    stats = dict(res.stats or {})
    for k in ("prefix_cache_queries", "prefix_cache_hits", "restore_s", "prefill_s_saved"):
        stats[k] = after[k] - before[k]
    if "t" in first:
        stats["ttft_s"] = first["t"] - t_start
    stats["total_s"] = time.perf_counter() - t_start
    res.stats = stats
    return res


# ---- lesson helpers: workload, experiments, figures ------------------------------------------------------
SYSTEM_PROMPT = """You are a careful reviewer for an online shop. You read one customer review at a time and \
answer with a single word: positive, negative or mixed. Follow these rules exactly.
1. Judge the review as a whole, not its first sentence. Customers often start with praise and end with a \
complaint, or the other way round; the last word they leave you with usually carries the most weight.
2. A complaint about delivery, packaging or customer service counts, even when the product itself is fine. \
A late parcel that arrived intact is a mild complaint; a broken product is a strong one.
3. Sarcasm is common. "Great, it broke after two days" is negative. Read tone, not only words.
4. Comparisons matter: "better than my old one" is positive only if the old one was acceptable.
5. A refund or a replacement that was handled well can turn a negative experience into a mixed one, \
but rarely into a positive one.
6. Ignore star ratings quoted in the text; they are often inconsistent with what the customer writes.
7. If the review is about a different product than the one listed, answer mixed.
8. Reviews in other languages are judged the same way; do not translate them in your answer.
9. Never explain your answer, never add punctuation, never repeat the review.
10. When in doubt between two labels, prefer mixed over a strong label.
"""
_RULE_TOPICS = ["battery life", "noise", "size", "colour", "smell", "instructions", "warranty", "price",
                "weight", "setup time", "durability", "comfort", "the app", "spare parts", "the charger"]
_ITEM_TEMPLATES = ["Review: The {t} is {a}, and {b}.\nLabel:", "Review: {b}; the {t} was {a}.\nLabel:",
                   "Review: Honestly the {t} is {a}. {b}.\nLabel:"]
_ADJ = ["excellent", "terrible", "fine", "disappointing", "better than expected", "awful", "great"]
_TAIL = ["delivery was fast", "it broke after a week", "support never answered", "I would buy it again",
         "the box was crushed", "my kids love it", "it does the job"]


def system_prompt_ids(engine, n_tokens: int = 552) -> list[int]:
    """Exactly n_tokens of a long, realistic instruction (the shared prefix of a batch-scoring job)."""
    text, i = SYSTEM_PROMPT, 11
    ids = engine.encode(text)
    while len(ids) < n_tokens:
        t = _RULE_TOPICS[i % len(_RULE_TOPICS)]
        text += (f"{i}. Remarks about {t} count like any other remark: weigh them by how much they would "
                 f"matter to a typical buyer, not by how long the customer wrote about them.\n")
        i += 1
        ids = engine.encode(text)
    return ids[:n_tokens]


def make_items(engine, n: int, seed: int = 0) -> list[list[int]]:
    """n short reviews to score behind the system prompt (seeded)."""
    import random
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        tpl = rng.choice(_ITEM_TEMPLATES)
        out.append(engine.encode(tpl.format(t=rng.choice(_RULE_TOPICS), a=rng.choice(_ADJ), b=rng.choice(_TAIL))))
    return out


def tiny_random_model(out_dir, seed: int = 0, vocab: int = 512, tokenizer_json: str | None = None) -> Path:
    """A tiny random OLMoE-style model in the streaming layout (2 layers, 4 experts): for fast demos
    and tests. Two seeds give two models with identical shapes and vocabulary, different weights."""
    from lessonkit.engine.checkpoint import convert_hf_state_dict
    g = torch.Generator().manual_seed(seed)
    D, I, H, KV, hd, E, L = 32, 32, 4, 2, 8, 4, 2
    cfg = dict(model_type="olmoe", vocab_size=vocab, hidden_size=D, intermediate_size=I, num_hidden_layers=L,
               num_attention_heads=H, num_key_value_heads=KV, num_experts=E, num_experts_per_tok=2,
               max_position_embeddings=2048, rms_norm_eps=1e-5)

    def r(*s):
        return torch.randn(*s, generator=g) * 0.5

    sd = {"model.embed_tokens.weight": r(vocab, D), "model.norm.weight": torch.ones(D), "lm_head.weight": r(vocab, D)}
    for l in range(L):
        p = f"model.layers.{l}."
        sd[p + "input_layernorm.weight"] = torch.ones(D)
        sd[p + "post_attention_layernorm.weight"] = torch.ones(D)
        for n, s in (("q_proj", (H * hd, D)), ("k_proj", (KV * hd, D)), ("v_proj", (KV * hd, D)), ("o_proj", (D, H * hd))):
            sd[p + f"self_attn.{n}.weight"] = r(*s)
        sd[p + "self_attn.q_norm.weight"] = torch.ones(H * hd)
        sd[p + "self_attn.k_norm.weight"] = torch.ones(KV * hd)
        sd[p + "mlp.gate.weight"] = r(E, D)
        for e in range(E):
            for n, s in (("gate_proj", (I, D)), ("up_proj", (I, D)), ("down_proj", (D, I))):
                sd[p + f"mlp.experts.{e}.{n}.weight"] = r(*s)
    convert_hf_state_dict(cfg, sd, out_dir, tokenizer_json, source=f"tiny random model seed {seed}")
    return Path(out_dir)


def _load(model):
    if not isinstance(model, (str, os.PathLike)):
        return model
    from lessonkit.engine.registry import load_model
    return load_model(str(model))


def score_in_new_process(model, cache_dir, prefix_ids, items, *, block_size: int = DEFAULT_BLOCK_SIZE,
                         budget_bytes: int = DEFAULT_BUDGET_BYTES, timeout: float = 3600) -> ScoreResult:
    """Run score() with the prefix cache in a fresh Python process (a real restart: nothing in memory).

    model: a registry name or model directory. The child's stats gain load_s (model load and
    fingerprint, not counted in total_s) and pid. Scores come back bit-exact (a safetensors file).
    """
    import subprocess
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp) / "job.json"
        job.write_text(json.dumps({"model": str(model), "cache_dir": str(cache_dir), "prefix_ids": list(prefix_ids),
                                   "items": [list(i) for i in items], "block_size": block_size,
                                   "budget_bytes": budget_bytes, "out": str(Path(tmp) / "out.safetensors")}))
        root = str(Path(__file__).resolve().parents[1])
        env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
        r = subprocess.run([sys.executable, "-m", "lessonkit.prefix_cache", str(job)], capture_output=True,
                           text=True, timeout=timeout, env=env)
        if r.returncode != 0:
            raise LessonkitError(f"prefix cache worker failed: {r.stderr.strip().splitlines()[-1:] or r.returncode}")
        from safetensors.torch import load_file
        out = load_file(Path(tmp) / "out.safetensors")
        stats = json.loads((Path(tmp) / "out.json").read_text())
    lengths = [len(i) for i in items]
    toks = list(torch.split(out["token_logprobs"], lengths)) if lengths else []
    return ScoreResult([float(t.sum()) for t in toks], [t.clone() for t in toks], out["last_logits"], stats)


def _worker_main(job_path: str) -> int:
    from safetensors.torch import save_file
    job = json.loads(Path(job_path).read_text())
    t0 = time.perf_counter()
    eng = _load(job["model"])
    pc = PrefixCache(job["cache_dir"], eng, budget_bytes=job["budget_bytes"], block_size=job["block_size"])
    load_s = time.perf_counter() - t0
    res = score(eng, job["prefix_ids"], job["items"], prefix_cache=pc)
    save_file({"token_logprobs": torch.cat(res.token_logprobs) if res.token_logprobs else torch.zeros(0),
               "last_logits": res.last_logits.contiguous()}, job["out"])
    Path(job["out"]).with_suffix(".json").write_text(json.dumps({**res.stats, "load_s": load_s, "pid": os.getpid()}))
    return 0


def batch_scoring_experiment(model, cache_dir, n_prefix: int = 552, n_items: int = 50, seed: int = 0,
                             progress: bool = True):
    """Cache off, cold, and warm after a restart (a second process): total time, TTFT, identical scores.

    Returns (DataFrame, results dict). The cache directory is cleared first so "cold" is cold.
    """
    import pandas as pd
    eng = _load(model)
    prefix, items = system_prompt_ids(eng, n_prefix), make_items(eng, n_items, seed)
    pc = PrefixCache(cache_dir, eng)
    pc.clear()
    score(eng, prefix, items[:1])           # warm-up (kernel set-up for these shapes), not timed
    off = score(eng, prefix, items, progress=progress)
    cold = score(eng, prefix, items, prefix_cache=pc, progress=progress)
    model_ref = model if isinstance(model, (str, os.PathLike)) else str(eng.model_dir)
    warm = score_in_new_process(model_ref, cache_dir, prefix, items)
    res = {"off": off, "cold": cold, "warm after restart": warm}
    rows = []
    for mode, r in res.items():
        rows.append({"mode": mode, "items": r.stats["items"], "prefix tokens": r.stats["prefix_tokens"],
                     "total s": r.stats["total_s"], "TTFT s": r.stats["ttft_s"],
                     "prefill s": r.stats["prefill_s"], "restore s": r.stats["restore_s"],
                     "prefix_cache_hits": r.stats["prefix_cache_hits"],
                     "prefix_cache_queries": r.stats["prefix_cache_queries"],
                     "speed-up vs off": off.stats["total_s"] / r.stats["total_s"],
                     "identical to off": results_identical(off, r)})
    return pd.DataFrame(rows), res


def restore_vs_prefill(engine, cache_dir, lengths=(64, 128, 256, 552), repeats: int = 3, progress: bool = True):
    """Prefill time vs restore time (fresh cache, full verification) as the prefix grows.

    Returns (DataFrame, Figure). Restore includes reading the file, checking its SHA-256 and copying
    into the KV cache; the page cache is warm (the file was just written), as in a server restart.
    """
    import matplotlib.pyplot as plt
    import pandas as pd
    from lessonkit.bench_util import median_time
    ids = system_prompt_ids(engine, max(lengths))
    pc = PrefixCache(cache_dir, engine)
    rows = []
    for n in _progress(list(lengths), progress, "restore vs prefill"):
        prefix = ids[:n]
        c = engine.new_cache(n)
        t_pre, _ = median_time(lambda: engine.forward(prefix, engine.new_cache(n), last_only=True), repeats, warmup=1)
        engine.forward(prefix, c, last_only=True)
        path = pc.save(prefix, c)

        def restore():
            got = pc.lookup_and_restore(prefix, engine.new_cache(n))
            assert got == n, got
        t_res, _ = median_time(restore, repeats, warmup=1)
        rows.append({"prefix tokens": n, "prefill s": t_pre, "restore s": t_res, "restore / prefill": t_res / t_pre,
                     "bytes on disk": path.stat().st_size, "bytes per token": path.stat().st_size / n})
    df = pd.DataFrame(rows)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(df["prefix tokens"], df["prefill s"], "o-", label="prefill (compute)")
    ax.plot(df["prefix tokens"], df["restore s"], "s-", label="restore from disk (verified)")
    ax.set_xlabel("prefix length (tokens)")
    ax.set_ylabel("time (s)")
    ax.set_yscale("log")
    ax.legend()
    last = df.iloc[-1]
    ax.set_title(f"{getattr(engine, 'name', 'model')}: restoring {int(last['prefix tokens'])} tokens costs "
                 f"{last['restore / prefill']:.1%} of their prefill")
    fig.tight_layout()
    return df, fig


def kv_bytes_per_token(config, dtype=torch.float32) -> int:
    """K and V for one position: 2 x layers x kv heads x head dim x bytes per element."""
    return 2 * config.n_layers * config.n_kv_heads * config.head_dim * torch.empty(0, dtype=dtype).element_size()


def provenance_demo(engine_a, engine_b, prompt_ids, cache_dir, n_new: int = 8) -> dict:
    """What a cache keyed only by shape would serve after swapping weights, and what ours does.

    engine_b has the same shapes and vocabulary as engine_a, other weights. The state saved by b is
    restored into a (a shape check passes) and a continues greedily: the continuation differs from
    a fresh prefill by a. Our PrefixCache, keyed by the fingerprint, refuses b's state.
    """
    prompt_ids = list(prompt_ids)

    def greedy_from(cache, logits):
        out = []
        for _ in range(n_new):
            t = int(torch.argmax(logits[-1]))
            out.append(t)
            logits = engine_a.forward([t], cache)
        return out

    fresh_cache = engine_a.new_cache(len(prompt_ids) + n_new + 1)
    fresh_logits = engine_a.forward(prompt_ids, fresh_cache)
    fresh = greedy_from(fresh_cache, fresh_logits)
    cb = engine_b.new_cache(len(prompt_ids))
    engine_b.forward(prompt_ids[:-1], cb, last_only=True)
    snap = cb.snapshot()
    shape_ok = snap["k"].shape[2:] == engine_a.new_cache(1).k.shape[2:] and snap["k"].shape[0] == engine_a.config.n_layers
    wrong_cache = engine_a.new_cache(len(prompt_ids) + n_new + 1)
    wrong_cache.restore(snap)                   # what a shape-keyed cache would do
    wrong_logits = engine_a.forward(prompt_ids[-1:], wrong_cache)
    wrong = greedy_from(wrong_cache, wrong_logits)
    PrefixCache(cache_dir, engine_b).save(prompt_ids[:-1], cb)
    ours = PrefixCache(cache_dir, engine_a).lookup_and_restore(prompt_ids, engine_a.new_cache(len(prompt_ids)))
    return {"same shapes and vocabulary": bool(shape_ok and engine_a.config.vocab_size == engine_b.config.vocab_size),
            "fingerprints differ": engine_a.fingerprint() != engine_b.fingerprint(),
            "fresh greedy continuation": fresh, "continuation from the other model's state": wrong,
            "shape-keyed cache changes the output": fresh != wrong,
            "max |logit difference| at the next token": float((fresh_logits[-1] - wrong_logits[-1]).abs().max()),
            "tokens our cache restored from the other model's state": ours}


def demo_models(directory) -> tuple[Path, Path]:
    """Two tiny random models with identical shapes, vocabulary and tokenizer, other weights (seeds 0, 1)."""
    d = Path(directory)
    tok = _fallback_tokenizer()
    out = []
    for seed in (0, 1):
        p = d / f"tiny-random-{seed}"
        if not (p / "config.json").exists():
            tiny_random_model(p, seed=seed, tokenizer_json=tok)
        out.append(p)
    return out[0], out[1]


def plot_batch_scoring(df):
    """Bar chart of total time and time to first score per mode (from batch_scoring_experiment)."""
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for ax, col in zip(axes, ("total s", "TTFT s")):
        ax.bar(df["mode"], df[col], color=["#999999", "#4477aa", "#228833"][: len(df)])
        ax.set_ylabel(f"{col.split()[0]} time (s)")
        ax.set_xlabel("prefix cache")
        for i, v in enumerate(df[col]):
            ax.annotate(f"{v:.2f}", (i, v), ha="center", va="bottom", fontsize=8)
    warm = df.iloc[-1]
    same = "identical scores" if bool(df["identical to off"].all()) else "SCORES DIFFER"
    fig.suptitle(f"{int(warm['items'])} items behind a {int(warm['prefix tokens'])}-token prompt: warm after a "
                 f"restart runs at {warm['speed-up vs off']:.1f}x the speed of no cache, {same}")
    fig.tight_layout()
    return fig


def bytes_per_token_table(engines, cache_dir, n_tokens: int = 64):
    """Measured snapshot bytes per token for each model, next to the K/V formula."""
    import pandas as pd
    rows = []
    for eng in engines:
        ids = system_prompt_ids(eng, n_tokens)
        c = eng.new_cache(n_tokens)
        eng.forward(ids, c, last_only=True)
        path = PrefixCache(cache_dir, eng).save(ids, c)
        size = path.stat().st_size
        cfg = eng.config
        rows.append({"model": eng.name, "layers": cfg.n_layers, "kv heads": cfg.n_kv_heads, "head dim": cfg.head_dim,
                     "dtype": _dtype_name(c.k.dtype), "tokens": n_tokens, "file bytes": size,
                     "bytes per token (file)": size / n_tokens,
                     "bytes per token (2*L*kv*hd*elem)": kv_bytes_per_token(cfg, c.k.dtype)})
    return pd.DataFrame(rows)


def partial_match_demo(engine, cache_dir, prefix_ids, question_ids):
    """How much of each prompt variant resumes from a saved prompt (longest prefix, chained blocks)."""
    import pandas as pd
    pc = PrefixCache(cache_dir, engine)
    full = list(prefix_ids) + list(question_ids)
    c = engine.new_cache(len(full))
    engine.forward(full, c, last_only=True)
    pc.save(full, c)
    mid = len(prefix_ids) // 2
    edited = list(prefix_ids)
    edited[mid] = (edited[mid] + 1) % engine.config.vocab_size
    variants = {"the saved prompt itself": full,
                "same system prompt, another question": list(prefix_ids) + list(question_ids[::-1]) + [question_ids[0]],
                f"one token edited at position {mid}": edited + list(question_ids),
                "first token different": [(full[0] + 1) % engine.config.vocab_size] + full[1:]}
    rows = []
    for name, ids in variants.items():
        n = pc.lookup_and_restore(ids, engine.new_cache(len(ids)), max_tokens=len(ids) - 1)
        rows.append({"prompt": name, "prompt tokens": len(ids), "restored tokens": n,
                     "prefilled tokens": len(ids) - n})
    return pd.DataFrame(rows)


def corruption_demo(engine, cache_dir, prefix_ids) -> dict:
    """Flip one bit in a saved snapshot: the next lookup warns (naming the file), restores nothing."""
    pc = PrefixCache(cache_dir, engine)
    ids = list(prefix_ids)
    c = engine.new_cache(len(ids))
    engine.forward(ids, c, last_only=True)
    path = pc.save(ids, c)
    data = bytearray(path.read_bytes())
    data[len(data) - 3] ^= 0x10
    path.write_bytes(bytes(data))
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        n = PrefixCache(cache_dir, engine).lookup_and_restore(ids, engine.new_cache(len(ids)))
    msgs = [str(w.message) for w in rec if issubclass(w.category, PrefixCacheWarning)]
    return {"restored tokens": n, "warnings": msgs, "file still there": path.exists()}


# ---- benchmark and CLI ----------------------------------------------------------------------------------
def bench(args) -> dict:
    """`lessonkit bench prefix`: prefill vs restore of a 552-token prefix; batch scoring off / cold / warm."""
    import tempfile
    from lessonkit.bench_util import machine_info, median_time, target
    smoke = bool(getattr(args, "smoke", False))
    repeats = max(1, int(getattr(args, "repeats", 3) or 3))
    n_prefix, n_items = (96, 6) if smoke else (552, 50)
    with tempfile.TemporaryDirectory() as tmp:
        model = getattr(args, "model", None)
        if model is None:
            if smoke:
                from lessonkit.engine.registry import MODELS_DIR
                model = "tiny-moe" if (MODELS_DIR / "tiny-moe" / "config.json").exists() else \
                    str(tiny_random_model(Path(tmp) / "tiny", tokenizer_json=_fallback_tokenizer()))
            else:
                model = "smollm2-135m"
        eng = _load(model)
        prefix, items = system_prompt_ids(eng, n_prefix), make_items(eng, n_items, 0)
        cdir = Path(tmp) / "cache"
        pc = PrefixCache(cdir, eng)
        t_pre, _ = median_time(lambda: eng.forward(prefix, eng.new_cache(n_prefix), last_only=True),
                               repeats, warmup=0 if not smoke else 1)
        c = eng.new_cache(n_prefix)
        eng.forward(prefix, c, last_only=True)
        size = pc.save(prefix, c).stat().st_size

        def restore():
            assert PrefixCache(cdir, eng).lookup_and_restore(prefix, eng.new_cache(n_prefix)) == n_prefix
        t_res, _ = median_time(restore, repeats, warmup=1)
        pc.clear()
        score(eng, prefix, items[:1])       # warm-up (kernel set-up for these shapes), not timed
        off = score(eng, prefix, items)
        cold = score(eng, prefix, items, prefix_cache=PrefixCache(cdir, eng))
        warms = [score(eng, prefix, items, prefix_cache=PrefixCache(cdir, eng)) for _ in range(repeats)]
        warm = sorted(warms, key=lambda r: r.stats["total_s"])[len(warms) // 2]
    rows = []
    for name, r in (("cache off", off), ("cold (prefill + save)", cold), ("warm (restore)", warm)):
        rows.append({"name": f"score {n_items} items: {name}", "tokens_per_s": (r.stats["item_tokens"] + n_items) / r.stats["total_s"],
                     "total_s": r.stats["total_s"], "ttft_s": r.stats["ttft_s"],
                     "prefix_cache_hits": r.stats["prefix_cache_hits"],
                     "prefix_cache_queries": r.stats["prefix_cache_queries"],
                     "identical_to_plain": results_identical(off, r)})
    rows.append({"name": f"prefill {n_prefix} tokens", "tokens_per_s": n_prefix / t_pre, "total_s": t_pre,
                 "identical_to_plain": True})
    rows.append({"name": f"restore {n_prefix} tokens", "tokens_per_s": n_prefix / t_res, "total_s": t_res,
                 "bytes_on_disk": size, "bytes_per_token": size / n_prefix, "identical_to_plain": True})
    ratio, speedup = t_res / t_pre, off.stats["total_s"] / warm.stats["total_s"]
    ident = all(r["identical_to_plain"] for r in rows)
    return {"bench": "prefix", "machine": machine_info(),
            "model": getattr(eng, "name", str(model)), "smoke": smoke, "repeats": repeats,
            "rows": rows,
            "targets": [target(f"restore / prefill time, {n_prefix}-token prefix", round(ratio, 4), "<= 0.05", ratio <= 0.05),
                        target(f"batch scoring {n_items} items: off / warm total time", round(speedup, 2), ">= 3", speedup >= 3),
                        target("scores identical (==) off / cold / warm", ident, "True", ident)]}


def _fallback_tokenizer() -> str:
    """A word-level tokenizer over 512 ids (for the tiny random model when no trained model exists)."""
    vocab = {"[UNK]": 0}
    words = sorted({w.strip(".,;:!?\"'0123456789").lower() for w in
                    (SYSTEM_PROMPT + " ".join(_RULE_TOPICS + _ADJ + _TAIL) + " review label remarks count like any "
                     "other remark weigh them by how much they would matter to a typical buyer not long the customer "
                     "wrote about").split()} - {""})
    for w in words[:500]:
        vocab[w] = len(vocab)
    return json.dumps({"version": "1.0", "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"},
                       "pre_tokenizer": {"type": "Whitespace"}, "decoder": None})


def _cmd(args) -> int:
    if not Path(args.dir).is_dir():
        raise LessonkitError(f"{args.dir}: no such prefix cache directory")
    eng = _load(args.model)
    pc = PrefixCache(args.dir, eng)
    if args.action == "clear":
        pc.clear()
    rep = pc.verify() if args.action == "verify" else {"entries": len(pc.entries()), "total_bytes": pc.total_bytes()}
    rep["dir"] = str(args.dir)
    print(json.dumps(rep) if args.json else "\n".join(f"{k}: {v}" for k, v in rep.items()))
    return 0 if not rep.get("bad") else 1


def register_cli(subparsers) -> None:
    p = subparsers.add_parser("prefix-cache", help="inspect, verify or clear a persistent prefix-KV cache directory")
    p.add_argument("action", choices=["info", "verify", "clear"])
    p.add_argument("dir")
    p.add_argument("--model", default="smollm2-135m", help="the model whose snapshots to check (its fingerprint)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd)


if __name__ == "__main__":
    sys.exit(_worker_main(sys.argv[1]))
