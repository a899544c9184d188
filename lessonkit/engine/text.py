"""Text in and out of a model: its `tokenizers` tokenizer, and the exact bytes a byte-level token stands for.

No torch: the engine (lessonkit.engine.engine) and the torch-free generate (lessonkit.engine.lean) share it.
"""
from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, pre_tokenizers

from lessonkit.errors import LessonkitError


def byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet (bytes_to_unicode), inverted: printable stand-in character -> byte."""
    global _BYTE_DECODER
    if _BYTE_DECODER is None:
        alphabet = pre_tokenizers.ByteLevel.alphabet()          # the 256 stand-in characters
        bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
        cs, n = bs[:], 0
        for b in range(256):
            if b not in bs:
                bs.append(b)
                cs.append(256 + n)
                n += 1
        _BYTE_DECODER = {chr(c): b for b, c in zip(bs, cs)}
        assert set(_BYTE_DECODER) == set(alphabet)
    return _BYTE_DECODER


_BYTE_DECODER: dict[str, int] | None = None


def load_tokenizer(model_dir: Path) -> Tokenizer | None:
    """The model folder's tokenizer.json, or None when it has none."""
    tok = Path(model_dir) / "tokenizer.json"
    if not tok.exists():
        return None
    try:
        return Tokenizer.from_file(str(tok))
    except Exception as e:
        raise LessonkitError(f"{tok}: cannot load tokenizer ({e})") from None


class TextCodec:
    """encode / decode / token_bytes for a class holding `tokenizer` (or None) and `model_dir`."""

    tokenizer: Tokenizer | None
    model_dir: Path

    def _need_tokenizer(self):
        if self.tokenizer is None:
            raise LessonkitError(f"{self.model_dir}: no tokenizer.json, so text cannot be encoded")
        return self.tokenizer

    def encode(self, text: str) -> list[int]:
        return self._need_tokenizer().encode(text, add_special_tokens=False).ids

    def decode(self, ids) -> str:
        return self._need_tokenizer().decode(list(ids), skip_special_tokens=False)

    def token_bytes(self, token_id: int) -> bytes:
        """The exact bytes a token stands for (byte-level BPE: also for tokens holding part of a UTF-8
        character, which decoding through text would turn into U+FFFD)."""
        tok = self._need_tokenizer()
        piece = tok.id_to_token(int(token_id))
        if piece is None:
            raise LessonkitError(f"token id {token_id} is not in the vocabulary")
        table = byte_decoder()
        if all(ch in table for ch in piece):
            return bytes(table[ch] for ch in piece)
        return piece.encode("utf-8")      # special tokens and non-byte-level vocabularies
