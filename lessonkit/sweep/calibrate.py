"""The sweep engine measured (`lessonkit sweep calibrate`, the figures of docs/sweep.md): the overhead per point
(a sweep of no-op points on an already running local cluster, so the cluster's start is counted apart), and the
speed-up of a local sweep over a serial loop of the same CPU-bound points (the loop runs them one after another
in this process, no Dask; the sweep's time includes starting its cluster). Every folder is a temporary one."""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

from lessonkit.sweep.cluster import ClusterConfig, local_cluster
from lessonkit.sweep.grid import Sweep
from lessonkit.sweep.run import run_serial, run_sweep


def _noops(n: int, work: int) -> Sweep:
    return Sweep("noop", None, {"value": list(range(n))}, {"work": work})


def overhead(n_points: int, workers: int) -> dict:
    """Seconds per no-op point through the whole engine (submit, run, atomic row, table), on a started cluster."""
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, local_cluster(workers) as cluster:
        start_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        run_sweep(_noops(n_points, 0), Path(tmp) / "s", ClusterConfig(scheduler=cluster.scheduler_address),
                  progress=False)
        sweep_s = time.perf_counter() - t1
    return {"workers": workers, "points": n_points, "cluster_start_s": start_s, "sweep_s": sweep_s,
            "overhead_ms_per_point": 1e3 * sweep_s / n_points}


def speedup(n_points: int, work: int, workers: int) -> dict:
    """A serial loop against a `workers`-worker LocalCluster sweep (its start included) of the same points."""
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        run_serial(_noops(n_points, work), Path(tmp) / "serial")
        serial_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        r = run_sweep(_noops(n_points, work), Path(tmp) / "sweep", ClusterConfig(workers=workers), progress=False)
        sweep_s = time.perf_counter() - t1
        share = {name: _cpu_share(Path(tmp) / name) for name in ("serial", "sweep")}
    assert r["done"] == n_points and r["failed"] == 0, r
    return {"workers": workers, "points": n_points, "work": work, "serial_s": serial_s, "sweep_s": sweep_s,
            "seconds_per_point": serial_s / n_points, "speedup": serial_s / sweep_s,
            "cpu_share_serial": share["serial"], "cpu_share_sweep": share["sweep"]}


def _cpu_share(folder: Path) -> float:
    """The CPU time the points got over their wall time: 1.0 is a whole core each, less when others' work
    shares the cores (on a loaded machine the speed-up is bounded by the cores it actually got)."""
    from lessonkit.sweep.store import read_table
    t = read_table(folder)
    return float(t.cpu_s.sum() / t.work_s.sum())


def scaling(point_s: float, overhead_s: float, start_s: float, n_points: int, workers: int) -> float:
    """The speed-up a sweep of n_points points of point_s seconds reaches on `workers` workers, from the measured
    per-point overhead and cluster start: serial n t / (start + ceil(n / N) (t + o))."""
    waves = -(-n_points // workers)
    return n_points * point_s / (start_s + waves * (point_s + overhead_s))


def calibrate(n_noop: int = 200, n_points: int = 8, work: int = 60_000_000, workers: int = 2) -> dict:
    import os

    from lessonkit.engine.machine import machine_record
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None      # others' work on the same cores
    over = [overhead(n_noop, w) for w in sorted({1, workers})]
    sp = speedup(n_points, work, workers)
    o = over[0]["overhead_ms_per_point"] / 1e3                 # one worker: the whole path of one point
    start = over[-1]["cluster_start_s"]
    model = {n: scaling(sp["seconds_per_point"], o, start, 100 * n, n) for n in (2, 4, 8, 16, 32, 64)}
    # the machine alone: the sweep engine's own figures load no model engine
    return {"machine": machine_record(engine=False), "date": time.strftime("%Y-%m-%d"), "load_before": load,
            "overhead": over, "speedup": sp,
            "scaling_100_points_per_worker": model}


def describe(r: dict) -> str:
    m = r["machine"]
    lines = [f"{m['cpu']}, {m['cpu_count']} logical CPUs, load average {r['load_before']} before, {r['date']}"]
    lines += [f"overhead: {o['overhead_ms_per_point']:.1f} ms per no-op point on {o['workers']} worker(s) ({o['points']} "
              f"points in {o['sweep_s']:.2f} s; the cluster started in {o['cluster_start_s']:.2f} s)" for o in r["overhead"]]
    s = r["speedup"]
    lines.append(f"speed-up: {s['points']} points of {s['seconds_per_point']:.2f} s: serial loop {s['serial_s']:.1f} s, "
                 f"{s['workers']}-worker local sweep {s['sweep_s']:.1f} s (its cluster's start included): "
                 f"{s['speedup']:.2f}x; each point got {s['cpu_share_serial']:.2f} of a core in the loop, "
                 f"{s['cpu_share_sweep']:.2f} in the sweep")
    lines.append("model, 100 such points per worker: " + ", ".join(
        f"{n} workers {v:.1f}x" for n, v in r["scaling_100_points_per_worker"].items()))
    return "\n".join(lines)
