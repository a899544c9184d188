"""The benchmarks: one module per `lessonkit bench NAME`, each with `bench(args) -> dict`.

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
    "engine": "lessonkit.bench.engine",
    "spec": "lessonkit.bench.spec",
    "mtp": "lessonkit.bench.mtp",
    "grammar": "lessonkit.bench.grammar",
    "grammar-masks": "lessonkit.bench.grammar_masks",
    "kernel": "lessonkit.bench.kernel",
    "llamacpp": "lessonkit.bench.llamacpp",
    "llamacpp-spec": "lessonkit.bench.llamacpp_spec",
    "native": "lessonkit.bench.native",
    "prefix": "lessonkit.bench.prefix",
    "semcache": "lessonkit.bench.semcache",
    "stack": "lessonkit.bench.stack",
    "streaming": "lessonkit.bench.streaming",
    "suffix": "lessonkit.bench.suffix",
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
    "numerics": ("numerics", None, None),
}
