"""score() with the prefix cache in a fresh Python process: a real restart, nothing in memory.

The parent writes a job file and runs `python -m lessonkit.prefix_cache.worker JOB`; the child loads
the model, scores, and writes the scores (safetensors, bit-exact) and its stats back.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from lessonkit.files.resources import PACKAGE_DIR
from lessonkit.errors import LessonkitError
from lessonkit.models.registry import load_model
from lessonkit.prefix_cache.cache import PrefixCache
from lessonkit.prefix_cache.generate import ScoreResult, score
from lessonkit.prefix_cache.snapshot import DEFAULT_BLOCK_SIZE, DEFAULT_BUDGET_BYTES

def score_in_new_process(model, cache_dir, prefix_ids, items, *, block_size: int = DEFAULT_BLOCK_SIZE,
                         budget_bytes: int = DEFAULT_BUDGET_BYTES, timeout: float = 3600) -> ScoreResult:
    """Run score() with the prefix cache in a fresh Python process (a real restart: nothing in memory).

    model: a registry name or model directory. The child's stats gain load_s (model load and
    fingerprint, not counted in total_s) and pid. Scores come back bit-exact (a safetensors file).
    """
    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp) / "job.json"
        job.write_text(json.dumps({"model": str(model), "cache_dir": str(cache_dir), "prefix_ids": list(prefix_ids),
                                   "items": [list(i) for i in items], "block_size": block_size,
                                   "budget_bytes": budget_bytes, "out": str(Path(tmp) / "out.safetensors")}),
                       encoding="utf-8")
        root = str(PACKAGE_DIR.parent)      # where this lessonkit is imported from
        env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
        r = subprocess.run([sys.executable, "-m", "lessonkit.prefix_cache.worker", str(job)], capture_output=True,
                           text=True, timeout=timeout, env=env, encoding="utf-8")
        if r.returncode != 0:
            raise LessonkitError(f"prefix cache worker failed: {r.stderr.strip().splitlines()[-1:] or r.returncode}")
        out = load_file(Path(tmp) / "out.safetensors")
        stats = json.loads((Path(tmp) / "out.json").read_text(encoding="utf-8"))
    lengths = [len(i) for i in items]
    toks = list(torch.split(out["token_logprobs"], lengths)) if lengths else []
    return ScoreResult([float(t.sum()) for t in toks], [t.clone() for t in toks], out["last_logits"], stats)


def main(job_path: str) -> int:
    """The child: score the job and write its results next to the job file's `out`."""
    job = json.loads(Path(job_path).read_text(encoding="utf-8"))
    t0 = time.perf_counter()
    eng = load_model(job["model"])
    pc = PrefixCache(job["cache_dir"], eng, budget_bytes=job["budget_bytes"], block_size=job["block_size"])
    load_s = time.perf_counter() - t0
    res = score(eng, job["prefix_ids"], job["items"], prefix_cache=pc)
    save_file({"token_logprobs": torch.cat(res.token_logprobs) if res.token_logprobs else torch.zeros(0),
               "last_logits": res.last_logits.contiguous()}, job["out"])
    Path(job["out"]).with_suffix(".json").write_text(json.dumps({**res.stats, "load_s": load_s, "pid": os.getpid()}),
                                                     encoding="utf-8")
    return 0



if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
