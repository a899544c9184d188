"""The prefix-KV snapshot: provenance fingerprint, chained block hashes, and the file format.

A snapshot is the KV state of the first n tokens of a prompt, stored as one safetensors file
(tensors "k", "v" [n_layers, n, n_kv_heads, head_dim] and "token_ids" int64 [n]) whose metadata
holds a JSON header (format version, provenance fingerprint, token ids hash, n tokens, dtype, the
chained block hashes, a SHA-256 of the payload, and a SHA-256 of the header itself so an edited
fingerprint is caught). Layout of a cache directory DIR:

    DIR/.lock                          file lock (lessonkit.files.portable_io): one writer of the index at a time
    DIR/index.json                     an acceleration only: rebuilt from the files when stale
    DIR/kv/<fingerprint[:32]>/<token ids sha256[:40]>.safetensors

Provenance: the fingerprint is a SHA-256 over the weight file hashes, the tokenizer, the model
config, dtype, quantisation and the cache format version. Colibri's .coli_kv checks dimensions
and vocabulary only, so a cache written by other weights of the same shape is served silently.

Longest-prefix match uses chained block hashes in vLLM's style: h_i = H(h_{i-1}, tokens of block i),
with h_0 derived from the fingerprint, so a prompt that shares only part of a saved prefix resumes
from the deepest shared block (or the exact end of a saved prompt), and prefills the rest.

Every read verifies the whole file (format, fingerprint, shapes, payload SHA-256, token ids) and
raises BadSnapshot with the reason; the cache (lessonkit.prefix_cache.cache) reports and removes it.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import struct
from pathlib import Path
from typing import Mapping, Sequence

import torch
from safetensors.torch import save

from lessonkit.engine.checkpoint import parse_safetensors_header
from lessonkit.files.safe_files import sha256_file
from lessonkit.errors import LessonkitError

FORMAT = "lessonkit-prefix-kv"

FORMAT_VERSION = 1

META_KEY = "lessonkit_prefix_kv"

DEFAULT_BLOCK_SIZE = 16

DEFAULT_BUDGET_BYTES = 2 * 1024**3

HASH_HEX = 32                      # 128-bit block and name hashes (hex chars)

_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I64": torch.int64,
           "I32": torch.int32, "U8": torch.uint8, "F64": torch.float64}

_DTYPE_NAMES = {v: k for k, v in _DTYPES.items()}



class BadSnapshot(Exception):
    """Why a snapshot file cannot be used (the message says)."""


# ---- provenance ---------------------------------------------------------------------------------
def _canonical(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def dtype_name(dtype) -> str:
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
        weights = sorted((Path(p).name, sha256_file(p)) for p in weight_files)
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
        "dtype": dtype_name(dtype),
        "quant": quant,
    }
    return hashlib.sha256(_canonical(record).encode("utf-8")).hexdigest()


def cache_key(engine_fingerprint: str) -> str:
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


def best_match(entries: dict, token_ids: list[int], key: str, root: str, exclude=()) -> tuple[str | None, int]:
    """(name, tokens) of the index entry of fingerprint `key` sharing the longest prefix with token_ids."""
    mine = {rel: e for rel, e in entries.items() if e.get("fingerprint") == key and rel not in exclude}
    best, best_n = None, 0
    for bs in sorted({e["block_size"] for e in mine.values()}):
        group = {rel: e for rel, e in mine.items() if e["block_size"] == bs}
        q = block_hashes(token_ids, bs, root)
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


# ---- the on-disk format ----------------------------------------------------------------------------
def _payload_sha256(tensors: Mapping[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        h.update(name.encode() + b"\0" + str(tuple(t.shape)).encode() + b"\0")
        h.update(memoryview(t.view(torch.uint8).reshape(-1).numpy()) if t.numel() else b"")
    return h.hexdigest()


def _header_sha256(header: Mapping) -> str:
    """SHA-256 over every header field (fingerprint, token ids hash, payload hash, ...) but itself: an
    edited header (a foreign snapshot relabelled with this model's fingerprint) no longer verifies.
    A checksum, not a signature: whoever may write the cache directory may forge anything in it."""
    return hashlib.sha256(_canonical({k: v for k, v in header.items() if k != "header_sha256"}).encode()).hexdigest()


def encode_snapshot(tensors: Mapping[str, torch.Tensor], header: dict) -> bytes:
    """Serialise tensors + header to safetensors bytes (the header goes in the metadata)."""
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    header = dict(header, payload_sha256=_payload_sha256(tensors))
    header["header_sha256"] = _header_sha256(header)
    return save(tensors, metadata={META_KEY: json.dumps(header, sort_keys=True)})


def read_header(path) -> dict:
    """The JSON header of a snapshot file without reading its tensors (raises BadSnapshot)."""
    with open(path, "rb") as f:
        return _parse_header(f, os.fstat(f.fileno()).st_size, path)[0]


def _parse_header(f, size: int, path) -> tuple[dict, dict, int]:
    """(snapshot header, safetensors header, data start); raises BadSnapshot."""
    try:
        meta, data_start, data_end = parse_safetensors_header(f, size)
    except ValueError as e:
        raise BadSnapshot(str(e)) from None
    try:
        header = json.loads(meta["__metadata__"][META_KEY])
    except (ValueError, KeyError, TypeError):
        raise BadSnapshot("no lessonkit prefix-KV header (not a snapshot, or edited header)") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise BadSnapshot("not a lessonkit prefix-KV snapshot")
    if header.get("format_version") != FORMAT_VERSION:
        raise BadSnapshot(f"format version {header.get('format_version')} (this lessonkit reads {FORMAT_VERSION})")
    if header.get("header_sha256") != _header_sha256(header):
        raise BadSnapshot("header checksum mismatch (edited header, or written by an older lessonkit)")
    if data_end != size:
        raise BadSnapshot(f"truncated: {size} bytes on disk, the header describes {data_end}")
    return header, meta, data_start


def load_snapshot(path, expect_key: str | None = None) -> tuple[dict, dict[str, torch.Tensor]]:
    """Read and fully verify one snapshot file; raises BadSnapshot with the reason."""
    with open(path, "rb") as f:
        return load_from_file(f, path, expect_key)


def load_from_file(f, path, expect_key: str | None):
    """load_snapshot of an open file (the cache opens it under its lock)."""
    size = os.fstat(f.fileno()).st_size
    header, meta, data_start = _parse_header(f, size, path)
    if expect_key is not None and header.get("fingerprint") != expect_key:
        raise BadSnapshot(f"foreign: written by another model/tokenizer/dtype (fingerprint "
                           f"{str(header.get('fingerprint'))[:12]}..., expected {expect_key[:12]}...)")
    buf = bytearray(size - data_start)
    f.seek(data_start)
    got = f.readinto(buf)
    if got != len(buf):
        raise BadSnapshot(f"truncated while reading ({got} of {len(buf)} data bytes)")
    tensors = {}
    for name, info in meta.items():
        if name == "__metadata__":
            continue
        dt = _DTYPES.get(info.get("dtype"))
        if dt is None:
            raise BadSnapshot(f"unknown dtype {info.get('dtype')!r} for {name!r}")
        a, b = info["data_offsets"]
        shape = tuple(info["shape"])
        t = torch.frombuffer(buf, dtype=torch.uint8, offset=a, count=b - a) if b > a else torch.empty(0, dtype=torch.uint8)
        if t.numel() != math.prod(shape) * torch.empty(0, dtype=dt).element_size():
            raise BadSnapshot(f"tensor {name!r} size does not match its shape {shape}")
        tensors[name] = t.view(dt).reshape(shape)
    for need in ("k", "v", "token_ids"):
        if need not in tensors:
            raise BadSnapshot(f"missing tensor {need!r}")
    if _payload_sha256(tensors) != header.get("payload_sha256"):
        raise BadSnapshot("payload checksum mismatch (edited or damaged bytes)")
    ids = tensors["token_ids"]
    n = header.get("n_tokens")
    if ids.dim() != 1 or ids.shape[0] != n or tensors["k"].shape[1] != n or tensors["k"].shape != tensors["v"].shape:
        raise BadSnapshot(f"shapes disagree with n_tokens={n}")
    if token_ids_sha256(ids.tolist()) != header.get("token_ids_sha256"):
        raise BadSnapshot("token ids hash mismatch")
    return header, tensors
