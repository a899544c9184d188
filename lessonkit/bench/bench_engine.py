"""`lessonkit bench engine`: lessonkit greedy decode vs transformers `generate` on the same weights,
side by side in one process, plus the expert store under a 25% budget and weight bandwidth."""
from __future__ import annotations

import tempfile

import torch
import transformers

from lessonkit.bench.common import decode_rate, goal, median_times, memcpy_bandwidth
from lessonkit.bench.bench_native import outside_kernel_share
from lessonkit.models.convert import export_hf
from lessonkit.engine.generate import generate
from lessonkit.models.registry import load_model, resolve_model_dir
from lessonkit.measure.timing import median_time
from lessonkit.engine.machine import machine_record

PROMPTS = ['{"ts": "2026-03-01T12:00:00Z", "host": "web-', "def parse_config(path):\n    ",
           "The expert cache keeps the most recently used"]


def _hf_generate(hf, prompt_ids, n):
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt_ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                          eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt_ids):].tolist()


def bench(args) -> dict:
    smoke = getattr(args, "smoke", False)
    model = getattr(args, "model", None) or "tiny-moe"
    n_new = 8 if smoke else 64
    repeats = 1 if smoke else max(1, getattr(args, "repeats", 3))
    prompts = PROMPTS[:1] if smoke else PROMPTS
    name, d = resolve_model_dir(model)
    eng = load_model(model)
    with tempfile.TemporaryDirectory() as tmp:
        export_hf(d, tmp)
        hf = transformers.AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32)
        hf.eval()
    ids = [eng.encode(p) for p in prompts]
    identical = all(generate(eng, p, n_new, use_eos=False).token_ids == _hf_generate(hf, p, n_new) for p in ids)
    t = median_times({"lk": lambda: [generate(eng, p, n_new, use_eos=False) for p in ids],
                      "hf": lambda: [_hf_generate(hf, p, n_new) for p in ids]}, repeats, warmup=0 if smoke else 1)
    t_lk, t_hf = t["lk"], t["hf"]
    total = n_new * len(ids)
    rows = [{"name": "transformers generate", "tokens_per_s": total / t_hf, "identical_to_plain": identical},
            {"name": "lessonkit greedy", "tokens_per_s": total / t_lk, "identical_to_plain": True}]
    ratio = t_hf / t_lk
    targets = [goal("lessonkit / transformers tokens per second", round(ratio, 3), ">= 1.5", ratio >= 1.5),
               goal("identical greedy tokens", identical, "true", identical)]
    c = eng.config
    if c.is_moe:
        quarter_mb = max(1, c.n_layers * c.n_experts // 4) * eng.expert_bytes / 2**20
        small = load_model(model, expert_budget_mb=quarter_mb)
        res = [generate(small, p, n_new, use_eos=False) for p in ids]
        same = all(a.token_ids == generate(eng, p, n_new, use_eos=False).token_ids for a, p in zip(res, ids))
        hits = sum(r.stats["expert_hits"] for r in res)
        misses = sum(r.stats["expert_misses"] for r in res)
        t_small, _ = median_time(lambda: [generate(small, p, n_new, use_eos=False) for p in ids], repeats, warmup=0)
        rows.append({"name": "lessonkit greedy, expert budget 25%", "tokens_per_s": total / t_small,
                     "identical_to_plain": same, "expert_hit_rate": hits / max(hits + misses, 1),
                     "bytes_read_per_token": sum(r.stats["bytes_read"] for r in res) / total,
                     "budget_mb": round(quarter_mb, 3)})
        targets.append(goal("25% budget: identical tokens", same, "true", same))
    else:
        # dense: achieved weight bandwidth vs this machine's memory-copy bandwidth
        rate = decode_rate(eng, ids[0], n_new)
        weight_bytes = sum(v.numel() * v.element_size() for k, v in eng.model.w.items() if k != "embed") \
            + c.n_layers * eng.expert_bytes
        bw = memcpy_bandwidth(64 if smoke else 256)
        frac = weight_bytes * rate / bw
        rows.append({"name": "lessonkit decode (weights streamed per token)", "tokens_per_s": rate,
                     "identical_to_plain": True, "weight_gb_per_s": weight_bytes * rate / 1e9,
                     "memcpy_gb_per_s": bw / 1e9, "weights": eng.weights,
                     "share_outside_kernel": outside_kernel_share(eng, ids[0], n_new)})
        targets.append(goal("weight bandwidth / memcpy bandwidth", round(frac, 3), ">= 0.5", frac >= 0.5))
    return {"bench": "engine", "model": name, "machine": machine_record(), "new_tokens_per_prompt": n_new,
            "repeats": repeats, "rows": rows, "targets": targets}
