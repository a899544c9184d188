"""The suffix drafter's global store: the target's earlier verified outputs, bounded, kept across restarts.

What it holds: whole outputs (token ids after each prompt), oldest first, and the suffix trie over them
(lessonkit.speculative.suffix.SuffixTrie) that the drafter matches against. Only `SuffixDrafter.finish()`
adds to it, with the tokens the target itself emitted: never a draft.

Bound and eviction: at most `max_tokens` tokens (DEFAULT_MAX_TOKENS). Adding an output that goes past the
bound drops the oldest outputs first (first in, first out) until the store fits again; their substrings leave
the trie (`SuffixTrie.remove`). A single output longer than the bound is not kept.

Key: the model's fingerprint (weights, tokenizer, config, dtype), the tokenizer's own SHA-256 and the
numerics the model computes with (exact or int8: different numerics give different greedy outputs). The
file is FOLDER/<model name>-<numerics>.suffix; FOLDER is chosen per run (an argument; `--draft suffix:DIR`),
by default lessonkit_home()/suffix.

File: b"LKSUFFIX\\n", a 4-byte little-endian header length, the header (JSON: format version, key, counts,
the payload's SHA-256), then the payload: for each output its length and its tokens, as little-endian int32.
`save()` writes it with lessonkit.files.atomic.atomic_write (temporary file, fsync, rename), so a reader sees
the old store or the whole new one, even when the writer is killed mid-save. Saving is explicit (`save()`),
or at the end of every run with `SuffixDrafter(autosave=True)`. Two processes one after the other share a
store; two at once: the last to save wins (each saves the store it loaded plus its own outputs).

A store that is foreign (another model, tokenizer or numerics), corrupt (bad magic, header or checksum),
truncated or oversized (more than this store's bound) is refused with one LessonkitError line naming the file.
"""
from __future__ import annotations

import hashlib
import json
import re
import struct
from collections import deque
from pathlib import Path

import numpy as np

from lessonkit.engine import kernel
from lessonkit.errors import LessonkitError
from lessonkit.files.atomic import atomic_write, remove_dead_temps
from lessonkit.files.resources import lessonkit_home
from lessonkit.files.safe_files import sha256_file
from lessonkit.speculative.suffix import DEPTH, SuffixTrie

MAGIC = b"LKSUFFIX\n"
FORMAT_VERSION = 1
DEFAULT_MAX_TOKENS = 16384          # ~9 trie nodes a token on structured outputs, ~260 bytes a node: ~40 MB
HEADER_MAX = 1 << 16


def default_folder() -> Path:
    return lessonkit_home() / "suffix"


def target_numerics(engine) -> str:
    """The numerics the target's forward computes with: its C forward's, else the kernel's current choice."""
    fwd = getattr(getattr(engine, "model", None), "c_forward", None)
    return kernel.numerics_of(fwd.path) if fwd is not None else kernel.NUMERICS


def store_key(engine) -> dict:
    """What a store belongs to: model (name, fingerprint), tokenizer (SHA-256), numerics, vocabulary size."""
    tok = Path(engine.model_dir) / "tokenizer.json"
    return {"model": engine.name, "fingerprint": engine.fingerprint(),
            "tokenizer": sha256_file(tok) if tok.exists() else "none", "numerics": target_numerics(engine),
            "vocab_size": int(engine.config.vocab_size)}


def max_file_bytes(max_tokens: int) -> int:
    """The largest file a store of max_tokens tokens can be: magic, header, a length and a token per token."""
    return len(MAGIC) + 4 + HEADER_MAX + 8 * max_tokens


class SuffixStore:
    """Outputs (oldest first) and their suffix trie, bounded by max_tokens; `path` is where it is saved."""

    def __init__(self, path: str | Path | None, key: dict, *, max_tokens: int = DEFAULT_MAX_TOKENS,
                 depth: int = DEPTH):
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise LessonkitError(f"suffix store max_tokens={max_tokens!r}: expected a positive integer")
        self.path = Path(path) if path is not None else None
        self.key, self.max_tokens = dict(key), max_tokens
        self.outputs: deque[list[int]] = deque()
        self.n_tokens = 0
        self.trie = SuffixTrie(depth)

    @classmethod
    def for_target(cls, engine, folder: str | Path | None = None, **kw) -> "SuffixStore":
        """The store of `engine` in `folder` (default: lessonkit_home()/suffix), loaded if it is on disk."""
        key = store_key(engine)
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", engine.name)
        store = cls(Path(folder if folder is not None else default_folder()) / f"{name}-{key['numerics']}.suffix",
                    key, **kw)
        if store.path.exists():
            store.load()
        return store

    # ---- contents ------------------------------------------------------------------------------------------
    def add(self, output: list[int]) -> None:
        """One verified output joins the store; the oldest go while the store is over its bound."""
        output = [int(t) for t in output]
        if not output or len(output) > self.max_tokens:
            return
        self.outputs.append(output)
        self.n_tokens += len(output)
        self.trie.add(output)
        while self.n_tokens > self.max_tokens:
            self._evict_oldest()

    def _evict_oldest(self) -> None:
        old = self.outputs.popleft()
        self.n_tokens -= len(old)
        self.trie.remove(old)

    def __len__(self) -> int:
        return len(self.outputs)

    # ---- file ----------------------------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        flat = []
        for out in self.outputs:
            flat.append(len(out))
            flat.extend(out)
        payload = np.asarray(flat, dtype="<i4").tobytes()
        header = json.dumps({"format_version": FORMAT_VERSION, "key": self.key, "n_outputs": len(self.outputs),
                             "n_tokens": self.n_tokens, "payload_sha256": hashlib.sha256(payload).hexdigest()},
                            sort_keys=True).encode()
        return MAGIC + struct.pack("<I", len(header)) + header + payload

    def save(self) -> Path:
        """Write the store atomically (the old file or the whole new one, never a mix)."""
        if self.path is None:
            raise LessonkitError("this suffix store has no file: give it a path to save it")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        remove_dead_temps(self.path.parent)
        return atomic_write(self.path, self.to_bytes())

    def _refuse(self, why: str) -> LessonkitError:
        return LessonkitError(f"suffix store {self.path}: {why}; delete it or choose another folder (suffix:DIR)")

    def load(self) -> None:
        """Replace the contents with the file's, after checking it whole; refuses a bad file naming it."""
        outputs = self._read_outputs()
        self.outputs, self.n_tokens, self.trie = deque(), 0, SuffixTrie(self.trie.depth)
        for out in outputs:
            self.add(out)

    def _read_header(self, data: bytes) -> tuple[dict, bytes]:
        if not data.startswith(MAGIC):
            raise self._refuse("not a suffix store (bad magic)" if len(data) >= len(MAGIC) else "truncated")
        if len(data) < len(MAGIC) + 4:
            raise self._refuse("truncated (no header)")
        (hlen,) = struct.unpack_from("<I", data, len(MAGIC))
        start = len(MAGIC) + 4
        if hlen > HEADER_MAX or start + hlen > len(data):
            raise self._refuse(f"truncated or corrupt header ({hlen} bytes claimed, {len(data) - start} there)")
        try:
            header = json.loads(data[start:start + hlen].decode("utf-8"))
            counts = int(header["n_outputs"]), int(header["n_tokens"])
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            raise self._refuse("corrupt header") from None
        if header.get("format_version") != FORMAT_VERSION:
            raise self._refuse(f"format version {header.get('format_version')!r}, expected {FORMAT_VERSION}")
        return header, data[start + hlen:]

    def _check_key(self, key) -> None:
        if not isinstance(key, dict):
            raise self._refuse("corrupt header (no key)")
        for field in ("model", "fingerprint", "tokenizer", "numerics"):
            if key.get(field) != self.key.get(field):
                raise self._refuse(f"foreign: written for {field} {str(key.get(field))[:16]!r} "
                                   f"(model {key.get('model')!r}), this one is {str(self.key.get(field))[:16]!r}")

    def _read_outputs(self) -> list[list[int]]:
        size = self.path.stat().st_size
        if size > max_file_bytes(self.max_tokens):
            raise self._refuse(f"oversized ({size} bytes; a store of at most {self.max_tokens} tokens "
                               f"is at most {max_file_bytes(self.max_tokens)})")
        header, payload = self._read_header(self.path.read_bytes())
        self._check_key(header.get("key"))
        n_out, n_tok = int(header["n_outputs"]), int(header["n_tokens"])
        if n_tok > self.max_tokens:
            raise self._refuse(f"oversized ({n_tok} tokens, this store's bound is {self.max_tokens})")
        if len(payload) != 4 * (n_out + n_tok):
            raise self._refuse(f"truncated ({len(payload)} payload bytes, the header says {4 * (n_out + n_tok)})")
        if hashlib.sha256(payload).hexdigest() != header.get("payload_sha256"):
            raise self._refuse("corrupt (payload checksum mismatch)")
        return self._split(np.frombuffer(payload, dtype="<i4").tolist(), n_out, n_tok)

    def _split(self, flat: list[int], n_out: int, n_tok: int) -> list[list[int]]:
        outputs, i, vocab = [], 0, self.key.get("vocab_size") or 2**31 - 1
        for _ in range(n_out):
            n = flat[i] if i < len(flat) else -1
            out = flat[i + 1:i + 1 + n]
            if n < 1 or len(out) != n or min(out) < 0 or max(out) >= vocab:
                raise self._refuse(f"corrupt (output {len(outputs)}: bad length or token id)")
            outputs.append(out)
            i += 1 + n
        if i != len(flat) or sum(map(len, outputs)) != n_tok:
            raise self._refuse("corrupt (lengths do not add up to the header's counts)")
        return outputs
