"""SQLite store of a semantic cache: entries, their scope, and an audit log of every served hit.

One file, standard library only. WAL journal so readers in other processes or threads never block
on a writer. Every entry carries a scope key (fingerprints of judge model, instruction template and
embedder); a store opened with one scope serves only that scope's entries and refuses to add an
entry from another, so a changed judge or embedder can never serve stale answers.

Tables: entries(id, scope, text, text_hash, embedding, answer, created, ttl, hits, audits, losses,
retired, margin, checksum), audit_log(id, scope, entry_id, query, similarity, served, audited, fresh,
agreed, t) and policy_state(scope, policy, audits, losses, stopped, t).
An in-memory matrix of the scope's live embeddings makes a lookup one matrix-vector product.

Integrity: each entry's checksum is a SHA-256 over what decides whether and what it serves (scope,
text, embedding bytes, answer, created, ttl, margin, and the retired flag once it is set; retiring an
entry rewrites its checksum). An entry whose checksum does not match (a flipped bit in the file, an
edit such as un-retiring it, a row written by an older lessonkit) is never served: it is left out of
the lookup, counted in `bad_entries`, and one warning names the file and how many. The counters
(hits, audits, losses) are not covered. A policy the audit stopped is recorded in policy_state with
its own checksum over (scope, policy, audits, losses, stopped), so it stays stopped after a restart
until reset_policy() is called; a row that fails its checksum counts as stopped (one warning).

A file store is probed for writing when it is opened: a read-only file or directory is one clear
error before any run starts, never an SQLite error in the middle of one.
"""
from __future__ import annotations

import hashlib
import sqlite3
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lessonkit.errors import LessonkitError
from lessonkit.files.safe_files import require_regular

SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
  id INTEGER PRIMARY KEY, scope TEXT NOT NULL, text TEXT NOT NULL, text_hash TEXT NOT NULL,
  embedding BLOB NOT NULL, answer INTEGER NOT NULL, created REAL NOT NULL, ttl REAL,
  hits INTEGER NOT NULL DEFAULT 0, audits INTEGER NOT NULL DEFAULT 0,
  losses INTEGER NOT NULL DEFAULT 0, retired INTEGER NOT NULL DEFAULT 0, margin REAL, checksum TEXT);
CREATE INDEX IF NOT EXISTS entries_scope_hash ON entries(scope, text_hash);
CREATE TABLE IF NOT EXISTS audit_log (
  id INTEGER PRIMARY KEY, scope TEXT NOT NULL, entry_id INTEGER NOT NULL, query TEXT NOT NULL,
  similarity REAL NOT NULL, served INTEGER NOT NULL, audited INTEGER NOT NULL,
  fresh INTEGER, agreed INTEGER, t REAL NOT NULL);
CREATE TABLE IF NOT EXISTS policy_state (
  scope TEXT NOT NULL, policy TEXT NOT NULL, audits INTEGER NOT NULL, losses INTEGER NOT NULL,
  stopped INTEGER NOT NULL, t REAL NOT NULL, checksum TEXT, PRIMARY KEY (scope, policy));
"""


class SemcacheIntegrityWarning(UserWarning):
    """Entries of a semantic-cache file failed their checksum and are never served."""


def _num(x) -> str:
    return "-" if x is None else float(x).hex()


def _sha256_parts(*parts: bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(len(part).to_bytes(8, "little") + part)
    return h.hexdigest()


def entry_checksum(scope: str, text: str, embedding: bytes, answer: bool, created, ttl, margin,
                   retired: bool = False) -> str:
    """SHA-256 over the fields that decide whether an entry is served and what it answers. The retired
    flag is a part only once set, so a live entry's checksum is what it was before the flag was covered."""
    parts = [scope.encode(), text.encode("utf-8"), bytes(embedding),
             f"{int(bool(answer))}|{_num(created)}|{_num(ttl)}|{_num(margin)}".encode()]
    return _sha256_parts(*parts, *([b"retired"] if retired else []))


def policy_checksum(scope: str, policy: str, audits, losses, stopped) -> str:
    """SHA-256 over a policy's persisted audit state (what decides whether it serves at all)."""
    return _sha256_parts(scope.encode(), policy.encode("utf-8"), f"{audits}|{losses}|{int(bool(stopped))}".encode())


def scope_key(judge_fingerprint: str, instruction_fingerprint: str, embedder_fingerprint: str) -> str:
    return hashlib.sha256("\x00".join(
        [judge_fingerprint, instruction_fingerprint, embedder_fingerprint]).encode()).hexdigest()[:24]


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass
class Entry:
    id: int | None
    scope: str
    text: str
    embedding: np.ndarray
    answer: bool
    created: float
    ttl: float | None = None
    hits: int = 0
    audits: int = 0
    losses: int = 0
    retired: bool = False
    margin: float | None = None    # judge log-odds minus its bias when the answer was stored

    def expired(self, now: float) -> bool:
        return self.ttl is not None and now > self.created + self.ttl


class CacheStore:
    """Entries of one scope in an SQLite file (``":memory:"`` for a throwaway store)."""

    def __init__(self, path: str | Path, scope: str, *, clock=time.time, dim: int = 384):
        self.path, self.scope, self.clock, self.dim = str(path), scope, clock, dim
        if self.path != ":memory:":
            require_regular(self.path)          # a FIFO or a directory: named, never opened
        try:
            self.db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.executescript(SCHEMA)
            for table in ("entries", "policy_state"):   # files from before checksums: their rows verify as bad
                if "checksum" not in {r[1] for r in self.db.execute(f"PRAGMA table_info({table})")}:
                    self.db.execute(f"ALTER TABLE {table} ADD COLUMN checksum TEXT")
        except sqlite3.DatabaseError as exc:
            raise LessonkitError(f"cannot open cache store {self.path}: {exc}") from None
        self._probe_write()
        self._load()

    def _probe_write(self) -> None:
        """A write rolled back: a store SQLite can only read (a read-only file, directory or mount) is one
        clear error now, before a run starts, not an error at its first insert. A store another
        connection is writing (busy) is writable: the probe is skipped, without waiting."""
        self.db.execute("PRAGMA busy_timeout = 0")
        try:
            v = self.db.execute("PRAGMA user_version").fetchone()[0]
            self.db.execute("BEGIN IMMEDIATE")
            try:
                self.db.execute(f"PRAGMA user_version = {int(v)}")
            finally:
                self.db.execute("ROLLBACK")
        except sqlite3.DatabaseError as exc:
            if getattr(exc, "sqlite_errorname", "") not in ("SQLITE_BUSY", "SQLITE_LOCKED"):
                self.db.close()
                raise LessonkitError(f"cache store {self.path} cannot be written ({exc}); "
                                     f"use a writable file or the default in-memory store") from None
        self.db.execute("PRAGMA busy_timeout = 5000")       # sqlite3.connect's default wait

    def _load(self) -> None:
        rows = self.db.execute(
            "SELECT id, scope, text, embedding, answer, created, ttl, hits, audits, losses, retired, margin, "
            "checksum FROM entries WHERE scope = ? ORDER BY id", (self.scope,)).fetchall()
        self.entries: list[Entry] = []
        self.bad_entries: list[int] = []
        for r in rows:
            emb = np.frombuffer(r[3], dtype=np.float32) if isinstance(r[3], bytes) else np.zeros(0, np.float32)
            if (emb.shape[0] != self.dim or not isinstance(r[2], str) or not isinstance(r[10], int)
                    or r[12] != entry_checksum(r[1], r[2], r[3], r[4], r[5], r[6], r[11], bool(r[10]))):
                self.bad_entries.append(r[0])
                continue
            self.entries.append(Entry(r[0], r[1], r[2], emb, bool(r[4]), r[5], r[6], r[7], r[8],
                                      r[9], bool(r[10]), r[11]))
        if self.bad_entries:
            warnings.warn(f"{self.path}: {len(self.bad_entries)} semantic-cache entries fail their checksum "
                          f"(ids {self.bad_entries[:10]}{' ...' if len(self.bad_entries) > 10 else ''}) and are "
                          f"never served", SemcacheIntegrityWarning, stacklevel=3)
        self.by_hash = {text_hash(e.text): e for e in self.entries}
        self.matrix = (np.stack([e.embedding for e in self.entries]) if self.entries
                       else np.zeros((0, self.dim), np.float32))

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, entry: Entry) -> Entry:
        if entry.scope != self.scope:
            raise LessonkitError(f"entry scope {entry.scope} does not match the store scope {self.scope}")
        emb = np.ascontiguousarray(entry.embedding, dtype=np.float32).reshape(-1)
        if emb.shape[0] != self.dim:
            raise LessonkitError(f"embedding has {emb.shape[0]} dimensions, expected {self.dim}")
        if not np.isfinite(emb).all():
            raise LessonkitError("embedding has non-finite values")
        margin = None if entry.margin is None else float(entry.margin)
        ttl = None if entry.ttl is None else float(entry.ttl)
        entry.created, entry.ttl, entry.margin = float(entry.created), ttl, margin
        check = entry_checksum(entry.scope, entry.text, emb.tobytes(), entry.answer, entry.created, ttl, margin)
        cur = self.db.execute(
            "INSERT INTO entries(scope, text, text_hash, embedding, answer, created, ttl, margin, checksum) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (entry.scope, entry.text, text_hash(entry.text), emb.tobytes(), int(entry.answer),
             entry.created, ttl, margin, check))
        entry.id, entry.embedding = cur.lastrowid, emb
        self.entries.append(entry)
        self.by_hash[text_hash(entry.text)] = entry
        self.matrix = np.concatenate([self.matrix, emb[None, :]], axis=0)
        return entry

    def put(self, text: str, embedding: np.ndarray, answer: bool, ttl: float | None = None,
            margin: float | None = None) -> Entry:
        return self.add(Entry(None, self.scope, text, embedding, bool(answer), self.clock(), ttl,
                              margin=margin))

    def exact(self, text: str) -> Entry | None:
        e = self.by_hash.get(text_hash(text))
        return e if e is not None and self.usable(e) else None

    def usable(self, e: Entry) -> bool:
        return not e.retired and not e.expired(self.clock())

    def nearest(self, query: np.ndarray, threshold: float, k: int = 8) -> list[tuple[Entry, float]]:
        """Live entries with cosine >= threshold, most similar first (embeddings are unit norm)."""
        if not self.entries:
            return []
        sims = self.matrix @ np.asarray(query, dtype=np.float32).reshape(-1)
        idx = np.flatnonzero(sims >= threshold)
        if idx.size > k:
            idx = idx[np.argpartition(-sims[idx], k - 1)[:k]]
        idx = idx[np.argsort(-sims[idx], kind="stable")]
        return [(self.entries[i], float(sims[i])) for i in idx if self.usable(self.entries[i])]

    def log_hit(self, entry: Entry, query: str, similarity: float, served: bool,
                audited: bool, fresh: bool | None) -> None:
        agreed = None if fresh is None else int(fresh == entry.answer)
        entry.hits += 1
        if audited:
            entry.audits += 1
            entry.losses += 0 if agreed else 1
        self.db.execute(
            "INSERT INTO audit_log(scope, entry_id, query, similarity, served, audited, fresh, agreed, t) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (self.scope, entry.id, query, similarity, int(served), int(audited),
             None if fresh is None else int(fresh), agreed, self.clock()))
        self.db.execute("UPDATE entries SET hits = ?, audits = ?, losses = ? WHERE id = ?",
                        (entry.hits, entry.audits, entry.losses, entry.id))

    def retire(self, entry: Entry) -> None:
        """Never serve entry again; the flag is written with the checksum that covers it."""
        entry.retired = True
        check = entry_checksum(entry.scope, entry.text, np.ascontiguousarray(entry.embedding, np.float32).tobytes(),
                               entry.answer, entry.created, entry.ttl, entry.margin, retired=True)
        self.db.execute("UPDATE entries SET retired = 1, checksum = ? WHERE id = ?", (check, entry.id))

    def policy_state(self, policy: str) -> dict | None:
        """{audits, losses, stopped} the audit recorded for `policy` in this scope (None: never audited).
        A row that fails its checksum (an edit, a flipped bit) counts as stopped, with one warning."""
        r = self.db.execute("SELECT audits, losses, stopped, checksum FROM policy_state WHERE scope = ? AND policy = ?",
                            (self.scope, policy)).fetchone()
        if r is None:
            return None
        if r[3] != policy_checksum(self.scope, policy, r[0], r[1], r[2]) or not all(type(x) is int for x in r[:3]):
            warnings.warn(f"{self.path}: the recorded audit state of policy {policy!r} fails its checksum; "
                          f"the policy counts as stopped until reset_policy()", SemcacheIntegrityWarning, stacklevel=2)
            return {"audits": 0, "losses": 0, "stopped": True, "damaged": True}
        return {"audits": r[0], "losses": r[1], "stopped": bool(r[2])}

    def save_policy_state(self, policy: str, audits: int, losses: int, stopped: bool) -> None:
        audits, losses, stopped = int(audits), int(losses), int(bool(stopped))
        self.db.execute("INSERT OR REPLACE INTO policy_state(scope, policy, audits, losses, stopped, t, checksum) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?)", (self.scope, policy, audits, losses, stopped, self.clock(),
                                                         policy_checksum(self.scope, policy, audits, losses, stopped)))

    def reset_policy(self, policy: str) -> None:
        """Forget the audit's counts and stop for `policy` (an operator's decision after fixing the cause)."""
        self.db.execute("DELETE FROM policy_state WHERE scope = ? AND policy = ?", (self.scope, policy))

    def audit_log(self) -> list[dict]:
        cur = self.db.execute("SELECT * FROM audit_log WHERE scope = ? ORDER BY id", (self.scope,))
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row)) for row in cur.fetchall()]

    def close(self) -> None:
        self.db.close()
