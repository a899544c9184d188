"""`lessonkit bench stack`: the plain engine vs all techniques together on the stream, one run."""
from __future__ import annotations

from lessonkit.measure.stack import ablations, available_models, run_config
from lessonkit.engine.machine import machine_record

def bench(args) -> dict:
    """`lessonkit bench stack`: the plain engine vs all techniques together on the stream, one run."""
    smoke = bool(getattr(args, "smoke", False))
    cfg = run_config(args, smoke)
    model = getattr(args, "model", None)
    models = [model] if model else available_models(smoke)
    rows, targets, embed_s = [], [], 0.0
    for eng, df, runs, _, embed_s in ablations(models, cfg, rows=["plain engine", "all together"]):
        plain_w = float(df.loc[df["row"] == "plain engine", "wall_s"].iloc[0])
        for r in df.to_dict("records"):
            rows.append({"name": f"{eng.name}: {r['row']}", "tokens_per_s": r["tokens_per_s"],
                         "identical_to_plain": bool(r["identical_to_plain"]),          # every item, cache answers too
                         "engine_answers_identical": bool(r["engine_answers_identical"]), "wall_s": r["wall_s"],
                         "forwards": int(r["forwards"]), "expert_bytes": int(r["expert_bytes"]),
                         "judge_calls": int(r["judge_calls"]), "cache_hits": int(r["cache_hits"]),
                         "audited_losses": r["audited_losses"], "actionable_losses": r["actionable_losses"],
                         "model_drafter": r["model_drafter"]})
        a = df[df["row"] == "all together"].iloc[0]
        sp = plain_w / float(a["wall_s"])
        goal = 3.0 if eng.name.startswith("smollm2-135m") else 2.0          # issue 20: >= 3x on smollm2-135m
        empty = sum(not ans.strip() for r in runs.values() for ans in r.answers)
        hit_share = int(a["cache_hits"]) / max(1, cfg.n_items)
        targets += [
            {"name": f"{eng.name}: all together speed-up over the plain engine", "value": round(sp, 3),
             "target": f">= {goal}", "met": bool(sp >= goal)},
            {"name": f"{eng.name}: empty answers (every row, every item)", "value": empty, "target": 0, "met": empty == 0},
            {"name": f"{eng.name}: items served by the semantic cache", "value": round(hit_share, 3),
             "target": ">= 0.2", "met": bool(hit_share >= 0.2)},
            {"name": f"{eng.name}: engine outputs byte-identical to the plain engine",
             "value": bool(a["engine_answers_identical"]), "target": True, "met": bool(a["engine_answers_identical"])},
            {"name": f"{eng.name}: actionable losses from the semantic cache", "value": int(a["actionable_losses"]),
             "target": 0, "met": int(a["actionable_losses"]) == 0},
        ]
    return {"bench": "stack", "machine": {**machine_record(), "timing_threads": cfg.threads}, "smoke": smoke,
            "items": cfg.n_items, "warm_items": cfg.warm_items, "max_new_tokens": cfg.max_new_tokens, "embed_s": embed_s,
            "rows": rows, "targets": targets}
