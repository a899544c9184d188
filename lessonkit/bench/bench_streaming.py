"""`lessonkit bench streaming`: what an expert miss costs, the old layout (packed at every load) against the
new one (packed once, on disk: lessonkit.engine.blocks, format 2), side by side in one process.

The model (tiny-moe by default; smollm2-135m streams its MLPs as one expert a layer) is written into a
temporary folder in both layouts, from the same records: format 1 (float [3, I, D], or GGUF rows for native
blocks) and format 2. Two measures, each layout in turn within every repeat (medians):
- a miss alone: every expert read through each store (`ExpertStore._read`: the read and the placement
  into weights), and the bare positioned read of the same bytes, so placement = miss - read;
- streaming: greedy decode with a small expert budget (one layer's experts, two for a dense model), the
  store's own timer over its misses (ms per miss) and tokens per second; tokens compared (==).
Pack calls (blocks.pack_blocks, row_weight.pack_strips) are counted while the new layout streams: none is the goal.

Every miss is read from `--disk` (lessonkit.files.disk; default cold: past the page cache, from the disk itself).
The disk's read rate is measured on the packed expert file (`measure.disk.disk_read_rate`), and speculation is
run on it at the same small budget: the oracle drafter at a few (acceptance, depth) cells, the speed-up over
plain greedy predicted by lesson 1's disk cost model from the measured rate (`measure.break_even`), next to the
measured one.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from safetensors.torch import load_file, save_file

from lessonkit.bench.common import goal
from lessonkit.engine import blocks as qb
from lessonkit.engine import row_weight
from lessonkit.engine.checkpoint import experts_layout, save_packed_experts
from lessonkit.engine.config import ModelConfig
from lessonkit.engine.engine import Engine
from lessonkit.engine.expert_store import ExpertStore
from lessonkit.engine.generate import generate
from lessonkit.files.disk import COLD, Disk, after_read, parse_disk
from lessonkit.files.portable_io import read_at
from lessonkit.measure.break_even import cost_model_inputs, validate_cost_model
from lessonkit.measure.disk import disk_read_rate
from lessonkit.models.registry import resolve_model_dir
from lessonkit.engine.machine import machine_record

PROMPTS = ["The expert cache keeps the most recently used", "def parse_config(path):\n    "]
# the disk cost model's inputs are measured on these, its cells timed on PROMPTS: predicted out of sample
APART_PROMPTS = ["A mixture of experts routes each token to", "import os\nimport sys\n\nclass"]
LAYOUTS = ("format 1: packed at every load", "format 2: packed on disk")


@contextlib.contextmanager
def count_packs():
    """{"pack_blocks": n, "pack_strips": n}: calls of the two packing functions while the block runs."""
    calls = {"pack_blocks": 0, "pack_strips": 0}
    originals = [(qb, "pack_blocks", qb.pack_blocks), (row_weight, "pack_strips", row_weight.pack_strips)]

    def counted(name, fn):
        def wrapper(*a, **kw):
            calls[name] += 1
            return fn(*a, **kw)
        return wrapper

    for mod, name, fn in originals:
        setattr(mod, name, counted(name, fn))
    try:
        yield calls
    finally:
        for mod, name, fn in originals:
            setattr(mod, name, fn)


def _link(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)                 # the dense weights are only read: a hard link spares the copy
    except OSError:
        shutil.copyfile(src, dst)


def layout_copies(model_dir: Path, tmp: Path) -> tuple[Path, Path]:
    """(format-1 folder, format-2 folder) of one model, both written from its own expert records."""
    c = ModelConfig.load(model_dir / "config.json")
    src = model_dir / "experts.safetensors"
    records = load_file(src)
    if experts_layout(src) == 2:
        records = {k: qb.unpack_expert(v, c.intermediate_size, c.dim, k) for k, v in records.items()}
    out = []
    for name in ("format1", "format2"):
        d = tmp / name
        d.mkdir()
        for f in model_dir.iterdir():
            if f.is_file() and f.name.endswith((".json", ".safetensors", ".jinja")) and \
                    f.name not in ("experts.safetensors", "manifest.json"):
                _link(f, d / f.name)
        out.append(d)
    save_file(records, out[0] / "experts.safetensors", metadata={"format": "lessonkit-stream-v1"})
    save_packed_experts(records, out[1] / "experts.safetensors", c)
    return out[0], out[1]


def _engine(new_dir: Path, experts_file: Path, n_experts: int, disk: Disk) -> Engine:
    """An engine on new_dir streaming its experts from experts_file (either layout: legacy_rows lets the store
    read format 1's GGUF rows, which an engine refuses) with a budget of n_experts experts, misses read from disk."""
    eng = Engine(new_dir)
    c = eng.config
    eng.store.close()
    eng.store = eng.model.store = _store(experts_file, c, eng.weights == "native", disk, n_experts * eng.expert_bytes)
    return eng


def _store(path: Path, c: ModelConfig, native: bool, disk: Disk, budget: int | None = None) -> ExpertStore:
    return ExpertStore(path, c.n_layers, c.n_experts, (3, c.intermediate_size, c.dim), budget_bytes=budget,
                       native=native, legacy_rows=True, disk=disk)


def miss_alone(stores: dict, repeats: int) -> dict:
    """Median ms of one miss (read + placement) and of the bare read of the same bytes, per store."""
    out = {}
    times = {name: {"miss": [], "read": []} for name in stores}
    for _ in range(repeats):
        for name, st in stores.items():
            for key, (off, n, *_rest) in st._entries.items():
                t0 = time.perf_counter()
                st._read(key)
                times[name]["miss"].append(time.perf_counter() - t0)
                buf = np.empty(n, dtype=np.uint8)
                t0 = time.perf_counter()
                read_at(st._fd, buf, off)
                after_read(st.disk, st._fd, off, n, t0)
                times[name]["read"].append(time.perf_counter() - t0)
    for name, t in times.items():
        miss, read = statistics.median(t["miss"]) * 1e3, statistics.median(t["read"]) * 1e3
        out[name] = {"miss_ms": miss, "read_ms": read, "place_ms": miss - read}
    return out


def streaming(engines: dict, prompts: list[list[int]], n_new: int, repeats: int) -> tuple[dict, dict, dict]:
    """Per engine: median ms per miss (the store's timer), tokens/s, misses a run; the tokens; pack calls of
    the format-2 engine."""
    runs = {name: {"ms_per_miss": [], "tokens_per_s": []} for name in engines}
    tokens, misses, packs = {}, {}, {}
    for _ in range(repeats):
        for name, eng in engines.items():
            eng.store.clear()
            eng.store.reset_counters()
            with count_packs() as calls:
                t0 = time.perf_counter()
                tokens[name] = [generate(eng, p, n_new, use_eos=False).token_ids for p in prompts]
                wall = time.perf_counter() - t0
            packs[name] = dict(calls)
            st = eng.store
            misses[name] = st.misses
            runs[name]["ms_per_miss"].append(st.io_s / max(st.misses, 1) * 1e3)
            runs[name]["tokens_per_s"].append(n_new * len(prompts) / wall)
    med = {name: {k: statistics.median(v) for k, v in r.items()} | {"misses": misses[name]}
           for name, r in runs.items()}
    return med, tokens, packs


def speculation_on_disk(model_dir: Path, prompts: list[list[int]], apart: list[list[int]], budget: int, disk: Disk,
                        read_mb_s: float, smoke: bool) -> list[dict]:
    """Speculation (oracle drafter) over plain greedy at `budget` experts, misses read from `disk`: per
    (acceptance, depth) cell the speed-up lesson 1's cost model predicts from the measured rate and its inputs
    measured on the `apart` prompts, and the one measured on `prompts` (each run from an empty expert cache)."""
    cells = [(budget, 1.0, 2)] if smoke else [(budget, 1.0, 4), (budget, 0.7, 2), (budget, 0.0, 2)]
    n_new = 8 if smoke else 32
    inputs = cost_model_inputs(model_dir, apart, budget_experts=(budget,), rows=(1, 3) if smoke else (1, 3, 5),
                               max_new_tokens=n_new, repeats=3 if smoke else 7)
    check = validate_cost_model(model_dir, prompts, inputs, cells, disk=disk, read_mb_s=read_mb_s,
                                repeats=1 if smoke else 3)
    return [{"budget_experts": r.budget_experts, "acceptance": r.acceptance, "k": r.k,
             "predicted_speedup": round(r.predicted_speedup, 3), "measured_speedup": round(r.measured_speedup, 3),
             "error": round(r.error, 3)} for r in check.itertuples()]


def _disk_record(disk: Disk, experts_file: Path, repeats: int) -> dict:
    """The disk mode and its read rate measured on the expert file (what every --json records)."""
    rate = disk_read_rate(experts_file, disk, repeats=repeats)
    return {"mode": str(disk), "read_mb_s": round(rate["read_mb_s"], 1),
            "read_ms_median": round(rate["read_ms_median"], 4), "reads": rate["reads"], "bytes_read": rate["bytes_read"]}


def bench(args) -> dict:
    smoke = getattr(args, "smoke", False)
    model = getattr(args, "model", None) or "tiny-moe"
    repeats = 1 if smoke else max(1, getattr(args, "repeats", None) or 5)
    disk = parse_disk(getattr(args, "disk", None) or COLD)
    n_new = 8 if smoke else 32
    name, model_dir = resolve_model_dir(model)
    with tempfile.TemporaryDirectory(prefix="lessonkit-streaming-") as tmp:
        old_dir, new_dir = layout_copies(model_dir, Path(tmp))
        files = {LAYOUTS[0]: old_dir / "experts.safetensors", LAYOUTS[1]: new_dir / "experts.safetensors"}
        c = ModelConfig.load(new_dir / "config.json")
        budget = c.n_experts if c.is_moe else 2            # one layer's experts: every layer misses
        engines = {lay: _engine(new_dir, f, budget, disk) for lay, f in files.items()}
        native = engines[LAYOUTS[1]].weights == "native"
        prompts = [engines[LAYOUTS[1]].encode(p) for p in (PROMPTS[:1] if smoke else PROMPTS)]
        apart = [engines[LAYOUTS[1]].encode(p) for p in (APART_PROMPTS[:1] if smoke else APART_PROMPTS)]
        stores = {lay: _store(f, c, native, disk) for lay, f in files.items()}
        alone = miss_alone(stores, repeats)
        med, tokens, packs = streaming(engines, prompts, n_new, repeats)
        weights = engines[LAYOUTS[1]].weights
        for st in [*stores.values(), *(eng.store for eng in engines.values())]:
            st.close()                    # before the folder goes (Windows keeps open files)
        disk_rec = _disk_record(disk, files[LAYOUTS[1]], repeats)
        spec = speculation_on_disk(new_dir, prompts, apart, budget, disk, disk_rec["read_mb_s"], smoke)
    same = tokens[LAYOUTS[0]] == tokens[LAYOUTS[1]]
    rows = [{"name": lay, "miss_ms": round(alone[lay]["miss_ms"], 3), "read_ms": round(alone[lay]["read_ms"], 3),
             "place_ms": round(alone[lay]["place_ms"], 3), "stream_ms_per_miss": round(med[lay]["ms_per_miss"], 3),
             "misses_per_run": med[lay]["misses"], "tokens_per_s": round(med[lay]["tokens_per_s"], 2),
             "pack_calls": sum(packs[lay].values()), "identical_tokens": same} for lay in LAYOUTS]
    ratio = alone[LAYOUTS[1]]["miss_ms"] / alone[LAYOUTS[0]]["miss_ms"]
    n_packs = sum(packs[LAYOUTS[1]].values())
    targets = [goal("pack calls while streaming the packed layout", n_packs, "0", n_packs == 0),
               goal("identical tokens, old vs packed layout", same, "true", same),
               goal("ms per miss, packed / old layout", round(ratio, 3), "< 1", ratio < 1)]
    return {"bench": "streaming", "model": name, "machine": machine_record(),
            "weights": weights, "disk": disk_rec, "expert_budget": f"{budget} experts", "new_tokens_per_prompt": n_new,
            "repeats": repeats, "rows": rows, "speculation": spec, "targets": targets, "notes": _notes(disk_rec, spec)}


def _notes(disk_rec: dict, spec: list[dict]) -> list[str]:
    """The disk and the speculation cells in words (the table shows the layouts)."""
    notes = [f"disk {disk_rec['mode']}: {disk_rec['read_mb_s']:.0f} MB/s measured over {disk_rec['reads']} reads of "
             f"the packed expert file (median {disk_rec['read_ms_median']:.3f} ms a read)"]
    for r in spec:
        notes.append(f"speculation (oracle drafter), {r['budget_experts']} experts resident, a = {r['acceptance']:.1f}, "
                     f"k = {r['k']}: predicted {r['predicted_speedup']:.2f}x, measured {r['measured_speedup']:.2f}x")
    return notes
