"""The benchmarks: one module per `lessonkit bench NAME`, each with `bench(args) -> dict`.

Each runs a baseline and its contenders side by side in one process, reports medians of repeats and
ratios, and says which goals (`common.goal`) were met. None is part of the tests' pass/fail (a smoke
test runs each once). BENCHES names them; the CLI imports one only when it runs.

Imports: lessonkit.measure (the experiments the lessons share) and everything below it; no lesson and nothing
that draws (a test imports every bench module with matplotlib blocked).
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
