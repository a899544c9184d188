"""Plain decoding: prefill, decode_one_token, generate (greedy or seeded temperature / top-p sampling).

This is the reference every lossless technique is compared against: same tokens (greedy) or the same
distribution (sampling). Greedy decoding needs no torch (the torch-free generate, engine/lean.py, runs this loop
on numpy logits); sampling draws with torch's generator, imported where it samples.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from lessonkit.errors import LessonkitError
from lessonkit.engine.kv_cache import KVCache

if TYPE_CHECKING:
    import torch


@dataclass
class SamplingParams:
    temperature: float = 0.0     # 0 = greedy
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self):
        if self.temperature < 0:
            raise LessonkitError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise LessonkitError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def probs_from_logits(logits: torch.Tensor, temperature: float, top_p: float = 1.0) -> torch.Tensor:
    """The sampling distribution (float32) after temperature and nucleus (top-p) truncation."""
    import torch
    p = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sp, idx = torch.sort(p, descending=True, stable=True)
        keep = torch.cumsum(sp, -1) - sp < top_p          # smallest set whose mass reaches top_p
        keep[..., 0] = True                               # the top token always (a top_p below float32's
        sp = torch.where(keep, sp, torch.zeros_like(sp))  # smallest number, 1e-300, rounds to 0 and kept none)
        p = torch.zeros_like(p).scatter(-1, idx, sp)
        p = p / p.sum(-1, keepdim=True)
    return p


def greedy_picks(logits) -> list[int]:
    """The index of the first largest logit of each row of `logits` [rows, V] (a NaN counts as the largest, as in
    torch.argmax). A float32 CPU tensor is read as a numpy view: numpy's argmax is vectorised, torch's on one thread
    is not (a row of 49,152 logits: 5 us against 84 us on one thread of an Intel Xeon, family 6 model 207, 2026-12-05;
    a 5-row verify of smollm2-135m spent 0.4 ms, a tenth of its step, finding the target's picks); the same indices."""
    if getattr(logits, "dtype", None) is not None and str(logits.dtype) == "torch.float32" and logits.device.type == "cpu":
        logits = logits.detach().numpy()
    return logits.argmax(-1).reshape(-1).tolist()


def sample_token(logits, params: SamplingParams, gen: torch.Generator | None) -> int:
    """Greedy: the first of the largest logits (a torch tensor or a numpy array, the same index); else a draw."""
    if params.greedy:
        return greedy_picks(logits.reshape(1, -1))[0]
    import torch
    return int(torch.multinomial(probs_from_logits(logits, params.temperature, params.top_p), 1, generator=gen))


@dataclass
class GenerationResult:
    token_ids: list[int]
    text: str
    stats: dict = field(default_factory=dict)


class StopChecker:
    """Stop tokens and stop strings (the text is cut before the stop string)."""

    def __init__(self, engine, stop_token_ids=(), stop_strings=()):
        self.engine, self.stop_ids, self.stop_strings = engine, set(stop_token_ids), list(stop_strings)

    def done(self, new_ids: list[int]) -> bool:
        if new_ids and new_ids[-1] in self.stop_ids:
            return True
        if self.stop_strings:
            text = self.engine.decode(new_ids)
            return any(s in text for s in self.stop_strings)
        return False

    def trim(self, new_ids: list[int]) -> tuple[list[int], str]:
        """Drop tokens after the first stop; returns (ids, text)."""
        for i, t in enumerate(new_ids):
            if t in self.stop_ids:
                new_ids = new_ids[: i + 1]
                break
        text = self.engine.decode(new_ids) if self.engine.tokenizer is not None else ""
        for s in self.stop_strings:
            j = text.find(s)
            if j >= 0:
                text = text[:j]
                # keep the smallest token prefix whose text covers the trimmed text
                for n in range(len(new_ids) + 1):
                    if len(self.engine.decode(new_ids[:n])) >= j:
                        new_ids = new_ids[:n]
                        break
        return new_ids, text


class TextStreamer:
    """A generate callback that prints the text as tokens arrive (decoding the whole tail keeps UTF-8 intact)."""

    def __init__(self, eng):
        self.eng, self.ids, self.printed = eng, [], 0

    def __call__(self, token_id: int):
        self.ids.append(token_id)
        text = self.eng.decode(self.ids)
        if text.endswith("\ufffd"):
            return
        sys.stdout.write(text[self.printed:])
        sys.stdout.flush()
        self.printed = len(text)


def engine_counters(engine) -> dict:
    return dict(engine.store.counters())


def finish_stats(engine, before: dict, *, new_tokens: int, forwards: int, t_start: float, ttft: float,
                 unique_experts: int, extra: dict | None = None) -> dict:
    after = engine.store.counters()
    wall = time.perf_counter() - t_start
    hits = after["expert_hits"] - before["expert_hits"]
    misses = after["expert_misses"] - before["expert_misses"]
    st = {
        "new_tokens": new_tokens, "forwards": forwards, "wall_s": wall,
        "tokens_per_s": new_tokens / wall if wall > 0 else None, "ttft_s": ttft,
        "expert_hits": hits, "expert_misses": misses,
        "expert_hit_rate": hits / (hits + misses) if hits + misses else None,
        "bytes_read": after["bytes_read"] - before["bytes_read"],
        "io_s": after["io_s"] - before["io_s"],
        "unique_experts": unique_experts,
    }
    st["bytes_read_per_token"] = st["bytes_read"] / new_tokens if new_tokens else None
    st["unique_experts_per_token"] = unique_experts / new_tokens if new_tokens else None
    if extra:
        st.update(extra)
    return st


def request_cache(engine, n_prompt: int, max_new_tokens: int) -> KVCache:
    """A KV cache with room for this request only: the prompt and its new tokens, at most the model's context.
    A full-context cache of smollm2-135m is 360 MB of zeros, about 0.15 s to allocate: more than a short
    request's decoding, and the same on every call."""
    alloc = getattr(getattr(engine, "model", None), "alloc_len", None)
    return engine.new_cache(min(n_prompt + max_new_tokens, alloc)) if alloc else engine.new_cache()


def prefill(engine, prompt_ids: list[int], cache: KVCache) -> torch.Tensor:
    """Run the prompt; returns the logits of its last position."""
    if not prompt_ids:
        raise LessonkitError("the prompt is empty: at least one token is needed")
    return engine.forward(prompt_ids, cache, last_only=True)[-1]


def decode_one_token(engine, token: int, cache: KVCache) -> torch.Tensor:
    return engine.forward([token], cache)[-1]


def generate(engine, prompt_ids: list[int], max_new_tokens: int, *, temperature: float = 0.0, top_p: float = 1.0,
             seed: int = 0, stop_token_ids=(), stop_strings=(), callback: Callable[[int], None] | None = None,
             cache: KVCache | None = None, use_eos: bool = True) -> GenerationResult:
    """Plain autoregressive decoding, one forward per new token. stats["finish_reason"]: "stop" (an eos
    token or a stop string), "length" (max_new_tokens) or "context" (the KV cache or the model's context
    is full: generation stops there and keeps every token it made)."""
    params = SamplingParams(temperature, top_p, seed)
    if max_new_tokens < 0:
        raise LessonkitError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    stops = list(stop_token_ids) + (engine.config.eos_ids if use_eos else [])
    checker = StopChecker(engine, stops, stop_strings)
    cache = request_cache(engine, len(prompt_ids), max_new_tokens) if cache is None else cache
    gen = None if params.greedy else _generator(seed)
    before = engine_counters(engine)
    t0 = time.perf_counter()
    logits = prefill(engine, list(prompt_ids), cache) if cache.length == 0 else None
    if logits is None:  # caller restored a prefix: feed the rest of the prompt
        rest = list(prompt_ids)[cache.length:]
        if not rest:
            raise LessonkitError("the cache already holds the whole prompt: at least one new token is needed")
        logits = engine.forward(rest, cache, last_only=True)[-1]
    ttft = time.perf_counter() - t0
    forwards, unique = 1, engine.model.last_forward["unique_experts"]
    prefill_unique = unique
    out: list[int] = []
    limit, finish = min(cache.max_len, engine.config.max_seq_len), "length"
    while len(out) < max_new_tokens:
        t = sample_token(logits, params, gen)
        out.append(t)
        if callback is not None:
            callback(t)
        if checker.done(out):
            finish = "stop"
            break
        if len(out) == max_new_tokens:
            break
        if cache.length >= limit:
            finish = "context"
            break
        logits = decode_one_token(engine, t, cache)
        forwards += 1
        unique += engine.model.last_forward["unique_experts"]
    ids, text = checker.trim(out)
    stats = finish_stats(engine, before, new_tokens=len(ids), forwards=forwards, t_start=t0, ttft=ttft,
                         unique_experts=unique - prefill_unique,
                         extra={"prompt_tokens": len(prompt_ids), "tokens_per_forward": len(ids) / max(forwards, 1),
                                "finish_reason": finish})
    return GenerationResult(ids, text, stats)


def _generator(seed: int):
    import torch
    return torch.Generator().manual_seed(seed)


def context_budget(engine, n_prompt: int, max_new_tokens: int) -> tuple[int, str | None]:
    """(max_new_tokens that fit in the model's context after a prompt of n_prompt tokens, a note when
    fewer than asked): checked before generating, so no technique runs out of KV cache halfway."""
    limit = engine.config.max_seq_len
    room = limit - n_prompt
    if room < 1:
        raise LessonkitError(f"the prompt has {n_prompt} tokens and {engine.name}'s context holds {limit}: "
                             f"no room to generate")
    if max_new_tokens <= room:
        return max_new_tokens, None
    return room, (f"--max-new-tokens {max_new_tokens} is more than the {room} tokens left in {engine.name}'s "
                  f"context of {limit}; generation stops there (finish_reason 'context')")


def finish_reason(engine, res: GenerationResult, max_new_tokens: int, capped: bool) -> str:
    """Why a generation ended: its own stats["finish_reason"], or for techniques that do not say, "stop"
    (fewer tokens than allowed, or an eos token last) or "length"; "length" becomes "context" when the
    context capped max_new_tokens (context_budget)."""
    ids, reason = res.token_ids, (res.stats or {}).get("finish_reason")
    if reason is None:
        reason = "stop" if len(ids) < max_new_tokens or (ids and ids[-1] in engine.config.eos_ids) else "length"
    return "context" if reason == "length" and capped else reason
