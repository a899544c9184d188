"""A grammar seen through a tokenizer: the bytes of every token, a byte trie over the vocabulary,
the legal-token masks of a grammar state, and forced spans as draft tokens.

Token bytes come from the byte-level BPE alphabet (GPT-2's bytes_to_unicode), so tokens holding a
partial UTF-8 character map to their exact bytes (decoding them to text would give U+FFFD).
The tokenisation of a forced span need not be the model's: `{"name":"` may be one token for us and
three for the model; `draft_ids` backs off the last token(s) of a span for that reason.
"""
from __future__ import annotations

import numpy as np
import torch

from lessonkit.engine.engine import byte_decoder
from lessonkit.errors import LessonkitError
from lessonkit.grammar.automaton import Grammar, GrammarState
from lessonkit.grammar.masks import StateTable, TrieLevels, legal_tokens, walk_below


def token_byte_table(tokenizer) -> list[bytes | None]:
    """bytes of every token id (None for special/added tokens, which no grammar allows)."""
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    size = max(tokenizer.get_vocab_size(with_added_tokens=True), max(vocab.values()) + 1)
    special = set(tokenizer.get_added_tokens_decoder()) if hasattr(tokenizer, "get_added_tokens_decoder") else set()
    dec = byte_decoder()
    table: list[bytes | None] = [None] * size
    for piece, i in vocab.items():
        if i in special:
            continue
        if all(c in dec for c in piece):
            table[i] = bytes(dec[c] for c in piece)
        else:                                    # not a byte-level vocabulary: decode one token
            text = tokenizer.decode([i], skip_special_tokens=False)
            table[i] = None if "\ufffd" in text else text.encode("utf-8")
    return table


class TokenTrie:
    """A byte trie over the vocabulary: walking it with grammar states gives the legal tokens fast."""

    def __init__(self, table: list[bytes | None]):
        self.size = len(table)
        self.levels: TrieLevels | None = None
        self.root: tuple[dict, list] = ({}, [])
        for i, b in enumerate(table):
            if not b:
                continue
            node = self.root
            for byte in b:
                nxt = node[0].get(byte)
                if nxt is None:
                    nxt = node[0][byte] = ({}, [])
                node = nxt
            node[1].append(i)

    def allowed_ids(self, state: GrammarState) -> list[int]:
        """The reference walk: one automaton step per trie node, in Python (slow; tests compare with it)."""
        return walk_below(self.root, state)

    def longest_match(self, data: bytes) -> list[int]:
        """Greedy longest-match tiling of `data` with vocabulary tokens (a fallback tokeniser)."""
        ids, i = [], 0
        while i < len(data):
            node, best, j = self.root, None, i
            while j < len(data) and data[j] in node[0]:
                node = node[0][data[j]]
                j += 1
                if node[1]:
                    best = (j, node[1][0])
            if best is None:
                raise LessonkitError(f"byte {data[i:i + 1]!r} has no token in this vocabulary")
            i, t = best
            ids.append(t)
        return ids


_VOCABS: dict[int, tuple] = {}


def vocabulary_trie(tokenizer) -> tuple[list[bytes | None], TokenTrie]:
    """(token byte table, byte trie) of a tokenizer, built once per tokenizer object."""
    hit = _VOCABS.get(id(tokenizer))
    if hit is None or hit[0] is not tokenizer:
        if len(_VOCABS) > 4:
            _VOCABS.clear()
        table = token_byte_table(tokenizer)
        hit = _VOCABS[id(tokenizer)] = (tokenizer, table, TokenTrie(table))
    return hit[1], hit[2]


def trie_levels(trie: TokenTrie, table: list[bytes | None]) -> TrieLevels:
    """The trie's breadth-first arrays, built on first use (draft mode never needs them)."""
    if trie.levels is None:
        trie.levels = TrieLevels(table, trie.root)
    return trie.levels


class TokenGrammar:
    """A grammar together with a tokenizer's byte view: masks, span tokenisation."""

    def __init__(self, grammar: Grammar, tokenizer, eos_ids=()):
        self.grammar, self.tokenizer = grammar, tokenizer
        self.table, self.trie = vocabulary_trie(tokenizer)
        self.eos_ids = list(eos_ids)
        self._states = StateTable()
        self._masks: dict[GrammarState, np.ndarray] = {}
        self._spans: dict[bytes, list[int]] = {}

    def legal_array(self, state: GrammarState) -> np.ndarray:
        """BoolArray[V] of the tokens whose bytes are legal from `state` (EOS not included), cached per state;
        do not write to it."""
        arr = self._masks.get(state)
        if arr is None:
            if len(self._states) > 20_000:
                self._states = StateTable()
            arr = legal_tokens(trie_levels(self.trie, self.table), self._states, state)
            if len(self._masks) > 1024:
                self._masks.clear()
            self._masks[state] = arr
        return arr

    def allowed_ids(self, state: GrammarState) -> list[int]:
        """Legal token ids from `state`, ascending, then EOS when the parse is complete."""
        ids = np.flatnonzero(self.legal_array(state)).tolist()
        return ids + self.eos_ids if state.is_complete else ids

    def token_mask(self, state: GrammarState, size: int | None = None) -> torch.Tensor:
        """BoolTensor[V]: tokens whose bytes are legal from `state` (EOS too when the parse is complete)."""
        arr = self.legal_array(state)
        size = size or self.trie.size
        out = np.zeros(size, dtype=np.bool_)       # numpy: small torch ops crawl on an oversubscribed CPU
        n = min(size, len(arr))
        out[:n] = arr[:n]
        if state.is_complete:
            out[[i for i in self.eos_ids if 0 <= i < size]] = True
        return torch.from_numpy(out)

    def encode_span(self, span: bytes) -> list[int]:
        """Token ids whose bytes are exactly `span` (the tokenizer's own encoding when it round-trips)."""
        ids = self._spans.get(span)
        if ids is not None:
            return ids
        ids = None
        try:
            text = span.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if text is not None:
            enc = self.tokenizer.encode(text, add_special_tokens=False).ids
            if all(self.table[i] is not None for i in enc) and b"".join(self.table[i] for i in enc) == span:
                ids = enc
        if ids is None:
            ids = self.trie.longest_match(span)
        self._spans[span] = ids
        return ids

    def can_extend(self, token: int, state_after: GrammarState) -> bool:
        """Could a longer token start with this token's bytes and go on legally past `state_after`?"""
        node = self.trie.root
        for byte in self.table[token] or b"":
            node = node[0].get(byte)
            if node is None:
                return False
        return any(state_after.mask >> b & 1 for b in node[0])

    def draft_ids(self, state: GrammarState, backoff: int | str = 1, max_span_bytes: int = 256) -> list[int]:
        """The forced continuation from `state`, tokenised, minus the back-off.

        backoff=n drops the last n tokens when the span has more than n; backoff="auto" drops the last
        token only when a longer vocabulary token could merge it with the bytes that follow.
        """
        span, end = state.forced(max_span_bytes)
        if not span:
            return []
        ids = self.encode_span(span)
        if backoff == "auto":
            if ids and self.can_extend(ids[-1], end):
                ids = ids[:-1]
        elif len(ids) > backoff:
            ids = ids[:len(ids) - backoff]
        return ids

    def token_bytes(self, ids) -> bytes | None:
        out = bytearray()
        for i in ids:
            b = self.table[i] if 0 <= i < len(self.table) else None
            if b is None:
                return None
            out += b
        return bytes(out)


def token_mask(tg: TokenGrammar, state: GrammarState, size: int | None = None) -> torch.Tensor:
    return tg.token_mask(state, size)
