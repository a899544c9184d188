"""Drafters by name: what `--draft NAME[:ARG]` builds for a target, in one table (DRAFTERS).

Used by `generate`, the benches, the lessons and the capstone's model drafter (lessonkit.stack). A name maps to a
factory(target, arg, **kw) -> Drafter (lessonkit.speculative.drafters' protocol); a bad name or argument is one
LessonkitError naming it and the known names. "auto" is the target's shipped drafters, cheapest first: the suffix
drafter's match, else the feature head (or tiny-moe's draft model); the utility gate (k="auto") switches drafting
off where it does not pay.
"""
from __future__ import annotations

from lessonkit.engine import kernel, settings
from lessonkit.errors import LessonkitError
from lessonkit.feature_head.drafter import FeatureHeadDrafter
from lessonkit.grammar.drafter import GrammarDrafter, resolve_grammar
from lessonkit.grammar.tokens import TokenGrammar
from lessonkit.models.registry import load_model
from lessonkit.mtp.drafter import MtpDrafter
from lessonkit.speculative.drafters import Drafter, ModelDrafter, NGramDrafter, OracleDrafter
from lessonkit.speculative.first_of import FirstOf
from lessonkit.speculative.suffix import SuffixDrafter
from lessonkit.speculative.suffix_store import SuffixStore


def draft_weights() -> str | None:
    """A draft model's weights on the numerics in use: Q8_0 blocks quantised at load on the int8 numerics, so its
    products take integer dots as the target's do (tiny-draft's turn at k = 4: 164 -> 104 us, the same drafts on
    tiny-moe's training prompts: docs/speculative.md, "A draft model on the int8 numerics' blocks"); else, or where
    weights were asked for (LESSONKIT_WEIGHTS, a `use` block), the model's default (None)."""
    asked = settings.current().weights
    return "q8_0" if kernel.NUMERICS == "int8" and asked == "auto" else None


def _model_drafter(target, arg, **kw):
    eng = load_model(arg or "tiny-draft", weights=draft_weights())
    d = ModelDrafter(eng, name=arg or "tiny-draft", **{k: v for k, v in kw.items() if k in ("temperature", "top_p", "seed")})
    d.check_vocab(target)
    return d


def _ngram_drafter(target, arg, **kw):
    if arg is None:
        return NGramDrafter()
    try:
        n = int(arg)
    except ValueError:
        raise LessonkitError(f"ngram:N needs an integer n-gram size, got {arg!r}") from None
    return NGramDrafter(max_ngram=n)


def _oracle_drafter(target, arg, **kw):
    if arg is None:
        raise LessonkitError("the oracle drafter needs an error rate: oracle:P with P in [0, 1], e.g. oracle:0.3")
    try:
        p = float(arg)
    except ValueError:
        raise LessonkitError(f"oracle:P needs a number P in [0, 1], got {arg!r}") from None
    return OracleDrafter(target, p, seed=kw.get("seed", 0), horizon=kw.get("horizon", 128))


def _mtp_drafter(target, arg, **kw):
    """'mtp' (float head) or 'mtp:SCHEME' (quantised head, e.g. mtp:int8)."""
    return MtpDrafter(target, quant=arg or "none")


def _grammar_drafter(target, arg, **kw):
    """'grammar:NAME_OR_PATH' (a .json path is read as a JSON Schema)."""
    spec = arg or "json"
    g = resolve_grammar(schema=spec) if spec.endswith(".json") else resolve_grammar(grammar=spec)
    return GrammarDrafter(TokenGrammar(g, target.tokenizer, eos_ids=target.config.eos_ids))


def _head_drafter(target, arg, **kw):
    """'head' (the shipped feature head of the target) or 'head:PATH' (a head.safetensors)."""
    return FeatureHeadDrafter(target, arg)


def _suffix_drafter(target, arg, **kw):
    """'suffix' (store in lessonkit_home()/suffix) or 'suffix:DIR' (the store's folder); saved after every run."""
    return SuffixDrafter(SuffixStore.for_target(target, arg), autosave=True)


def auto_drafter(target, free) -> FirstOf:
    """--draft auto's drafter with `free` as its suffix part: the target's shipped drafters, cheapest first
    (speculative.first_of): the suffix drafter's match of >= 2 tokens (the request, and the store of earlier outputs
    where `free` has one), else the feature head where one ships for the target (its draft model where AUTO_LEARNED
    names one and the target holds every expert in memory: `streams_experts`); under the depth gate (k=auto) the
    match drafts at its own depth and the gate sets the learned drafter's, switching it off where it does not pay
    (own_depth). The benches pass a suffix drafter that does not learn (no request is measured against a store
    holding its own earlier output)."""
    why = "head" if streams_experts(target) else AUTO_LEARNED.get(target.name, "head")
    try:
        learned = _model_drafter(target, why) if why != "head" else FeatureHeadDrafter(target)
    except LessonkitError:
        learned, why = None, ""
    parts = [(free, 2)] + ([(learned, 1)] if learned is not None else [])
    return FirstOf(parts, name=f"auto (suffix match >= 2 tokens{', else ' + why if why else ''})", own_depth=1)


def _auto_drafter(target, arg, **kw):
    """'auto' (auto_drafter; the suffix store in lessonkit_home()/suffix) or 'auto:DIR' (the store's folder)."""
    return auto_drafter(target, _suffix_drafter(target, arg))


def streams_experts(target) -> bool:
    """Whether the target reads experts from disk as it decodes (ExpertStore.streams; a dense model: never)."""
    store = getattr(target, "store", None)
    return bool(store is not None and store.streams)


# the learned drafter `auto` falls back on, where it is not the target's feature head, with every expert in memory:
# tiny-moe's head accepts no more than tiny-draft there and costs more a turn (`auto` with the head 0.77x against
# 0.86x with tiny-draft, Zen 4). Where experts stream from disk the head drafts (1.74x and 1.59x against 1.24x and
# 1.45x on the cold disk with 2 experts a layer resident; docs/speculative.md, 2026-12-06)
AUTO_LEARNED = {"tiny-moe": "tiny-draft"}

# name -> factory(target, arg: str | None, **kw) -> Drafter
DRAFTERS = {
    "tiny-draft": lambda target, arg, **kw: _model_drafter(target, "tiny-draft", **kw),
    "smollm2-draft": lambda target, arg, **kw: _model_drafter(target, "smollm2-draft", **kw),
    "model": _model_drafter,          # model:NAME_OR_DIR
    "ngram": _ngram_drafter,          # ngram or ngram:N
    "oracle": _oracle_drafter,        # oracle:P
    "mtp": _mtp_drafter,              # mtp or mtp:SCHEME
    "grammar": _grammar_drafter,      # grammar or grammar:NAME_OR_PATH
    "suffix": _suffix_drafter,        # suffix or suffix:DIR (lessonkit.speculative.suffix)
    "head": _head_drafter,            # head or head:PATH (lessonkit.feature_head)
    "auto": _auto_drafter,            # auto or auto:DIR (the suffix store's folder)
}


def make_drafter(spec: str, target, **kw) -> Drafter:
    """A drafter from 'NAME[:ARG]': tiny-draft, model:DIR, ngram[:N], oracle:P, mtp[:SCHEME], grammar[:G]."""
    if not isinstance(spec, str) or not spec:
        raise LessonkitError(f"--draft needs a drafter name, got {spec!r}")
    name, _, arg = spec.partition(":")
    factory = DRAFTERS.get(name)
    if factory is None:
        raise LessonkitError(f"unknown drafter {spec!r}: known drafters are {', '.join(sorted(DRAFTERS))}")
    return factory(target, arg or None, **kw)
