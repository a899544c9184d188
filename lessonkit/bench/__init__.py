"""The benchmarks: one module per `lessonkit bench NAME`, each with `bench(args) -> dict`, named after its command
(bench_NAME.py, a dash as an underscore: `bench llamacpp-spec` is bench_llamacpp_spec.py), so no bench module
shares its file name with a module of another room (measure/engine.py is not bench/bench_engine.py). common.py and
spec_table.py are helpers of several benches.

Each runs a baseline and its contenders side by side in one process, reports medians of repeats and
ratios, and says which goals (`common.goal`) were met. None is part of the tests' pass/fail (a smoke
test runs each once). BENCHES names them; the CLI imports one only when it runs.

Imports: lessonkit.measure (the experiments the lessons share) and everything below it; no lesson and nothing
that draws (a test imports every bench module with matplotlib blocked).

OPTIONS are the options of `lessonkit bench NAME` (besides --json), as plain data: name -> (kind, default, help).
The CLI builds the command's arguments from them (lessonkit.cli, which turns each kind into its argparse type)
and a sweep its bench parameters (lessonkit.sweep.points), so the two cannot drift apart.
"""

BENCHES = {
    "engine": "lessonkit.bench.bench_engine",
    "spec": "lessonkit.bench.bench_spec",
    "mtp": "lessonkit.bench.bench_mtp",
    "grammar": "lessonkit.bench.bench_grammar",
    "grammar-masks": "lessonkit.bench.bench_grammar_masks",
    "kernel": "lessonkit.bench.bench_kernel",
    "llamacpp": "lessonkit.bench.bench_llamacpp",
    "llamacpp-spec": "lessonkit.bench.bench_llamacpp_spec",
    "native": "lessonkit.bench.bench_native",
    "prefix": "lessonkit.bench.bench_prefix",
    "semcache": "lessonkit.bench.bench_semcache",
    "stack": "lessonkit.bench.bench_stack",
    "streaming": "lessonkit.bench.bench_streaming",
    "suffix": "lessonkit.bench.bench_suffix",
}

# kind: flag (on or off), text, repeats (1 .. 1000), thread counts ("1,2"), disk (warm, cold or simulated:MB/s),
# numerics (exact or int8, the option every command shares). help None: the option has none.
OPTIONS = {
    "smoke": ("flag", False, "tiny sizes, just checks that it runs"),
    "model": ("text", None, None),
    "repeats": ("repeats", 3, None),
    "threads": ("thread counts", None, "C kernel thread counts, e.g. 1,2: llamacpp measures each (default 1,2), "
                                      "other benches use the first, torch too (default: physical cores)"),
    "disk": ("disk", "cold", "streaming: where expert misses are read from: cold (past the page cache: the disk "
                             "itself; default), warm (the page cache) or simulated:MB/s (a slower disk than yours)"),
    "engines": ("text", None, "llamacpp: which to measure, from llamacpp,lessonkit,transformers (default all)"),
    "build": ("flag", False, "llamacpp: download the llama-cpp-python sdist and build llama-bench into the cache "
                             "first (minutes)"),
    "ggml": ("text", None, "llamacpp: the llama.cpp build measured (and made by --build): native (default: GGML_NATIVE, "
                           "this CPU's best) or avx2 (AVX2 without AVX-512: an AVX2 CPU's kernels, e.g. Zen 3; run "
                           "beside LESSONKIT_KERNEL=avx2)"),
    "numerics": ("numerics", None, None),
}
