"""run_sweep: check the grid, skip the points already complete, submit the rest as one Dask task each, show
progress (done, running, failed; the dashboard's link when one is up), and write the table.

A point's task writes its own row (store.write_row, atomic) before it returns, so a worker killed mid-point
leaves no row, and Dask runs the point again on another worker; a task that finds its point complete (a
rescheduled task whose first run had finished) returns that row without running it again. A point that raises
is recorded as failed with its error and stops nothing else."""
from __future__ import annotations

import os
import socket
import sys
import time
import uuid
from pathlib import Path

from tqdm.auto import tqdm

from lessonkit.errors import LessonkitError
from lessonkit.sweep import store
from lessonkit.sweep.cluster import ClusterConfig, check, client_for, dashboard
from lessonkit.sweep.grid import Point, Sweep, checked, expand
from lessonkit.sweep.points import POINT_KINDS


def plan(sweep: Sweep) -> tuple[Sweep, list[Point]]:
    """The checked sweep and its points; every error (unknown parameter, empty list, wrong type) comes from
    here, before anything runs."""
    if sweep.kind not in POINT_KINDS:
        raise LessonkitError(f"unknown point kind {sweep.kind!r} ({', '.join(POINT_KINDS)})")
    what = f"{sweep.kind}:{sweep.target}" if sweep.target else sweep.kind
    good = checked(sweep, POINT_KINDS[sweep.kind].params(sweep.target), what)
    return good, expand(good)


def sweep_from(point: str, grid_args: list[str], set_args: list[str], grid_file: str | None = None,
               repeats: int | None = None) -> Sweep:
    """The command line's sweep: the grid file's grid, set and repeats, then --grid, --set and --repeats over them."""
    from lessonkit.sweep.grid import grid_from_args, load_grid_file
    from lessonkit.sweep.points import parse_point
    kind, target = parse_point(point)
    data = load_grid_file(grid_file) if grid_file else {}
    grid, fixed = grid_from_args(grid_args, set_args)
    return Sweep(kind, target, {**data.get("grid", {}), **grid}, {**data.get("set", {}), **fixed},
                 repeats if repeats is not None else data.get("repeats", 1))


def _worker_name() -> str:
    try:
        from distributed import get_worker
        return get_worker().address
    except ValueError:                      # not on a Dask worker (a serial loop)
        return f"local:{os.getpid()}"


def run_point(kind: str, target: str | None, point: Point, folder: str, run: str) -> dict:
    """On a worker: run one point (unless its row says it is complete) and write its row atomically."""
    from lessonkit.engine.machine import machine_record
    folder_p = Path(folder)
    row = store.read_row(folder_p, point.id)
    if row is not None and row["status"] == "ok":
        return {**row, "skipped": True}
    out_dir = folder_p / "points" / point.id
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    try:
        figures, status, error = POINT_KINDS[kind].run(target, dict(point.params), out_dir), "ok", None
    except Exception as e:  # a failing point is a row with its error; the others go on
        figures, status, error = {}, "failed", f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
    machine = machine_record(engine=kind != "noop", refuse_bad_weights=False)     # a no-op point loads no engine
    row = {"id": point.id, "repeat": point.repeat, "status": status, "params": point.params, "figures": figures,
           "seconds": round(time.perf_counter() - t0, 4), "error": error, "host": socket.gethostname(),
           "cpu": machine["cpu"], "kernel": machine.get("kernel", "none (no engine)"), "worker": _worker_name(), "run": run,
           "finished": time.strftime("%Y-%m-%dT%H:%M:%S"), "kind": kind, "target": target,
           "python": machine["python"], "machine": machine}
    store.write_row(folder_p, row)
    return row


def _lost(point: Point, error: BaseException, run: str) -> dict:
    """The row of a point whose task never returned (its workers died too often, or it was cancelled)."""
    return {"id": point.id, "repeat": point.repeat, "status": "failed", "params": point.params, "figures": {},
            "seconds": None, "error": f"{type(error).__name__}: {error}"[:300], "run": run,
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S")}


def _wait_all(client, futures: dict, folder: Path, bar, run: str) -> dict[str, int]:
    from distributed import wait
    counts = {"done": 0, "failed": 0, "reused": 0}
    pending, last = set(futures), None
    while pending:
        try:
            finished = wait(pending, timeout=0.5, return_when="FIRST_COMPLETED").done
        except TimeoutError:                # nothing finished in that half second
            finished = set()
        pending -= finished
        for f in finished:
            try:
                row = f.result()
            except Exception as e:  # KilledWorker, CancelledError: the task is lost, not the sweep
                row = store.read_row(folder, futures[f].id)
                if row is None or row["status"] != "ok":      # a whole row from an earlier attempt stands
                    store.write_row(folder, row := _lost(futures[f], e, run))
            counts["failed" if row["status"] == "failed" else "done"] += 1
            counts["reused"] += bool(row.get("skipped"))
            bar.update(1)
        slots = client.nthreads()
        running = sum(min(len(tasks), slots.get(w, 1)) for w, tasks in client.processing().items())
        if (shown := (counts["done"], running, counts["failed"])) != last:
            bar.set_postfix(done=shown[0], running=shown[1], failed=shown[2])
            last = shown
    return counts


def run_sweep(sweep: Sweep, folder: str | Path, cluster: ClusterConfig | None = None, *,
              progress: bool = True) -> dict:
    """Run every point of the sweep that is not complete in folder; returns what happened and writes
    folder/results.csv (also when interrupted)."""
    sweep, points = plan(sweep)
    check(cluster := cluster or ClusterConfig())
    folder = store.prepare(Path(folder).resolve(), sweep, points)
    todo = [p for p in points if not store.complete(folder, p.id)]
    summary = {"points": len(points), "skipped": len(points) - len(todo), "ran": len(todo), "done": 0,
               "failed": 0, "folder": str(folder), "dashboard": None}
    run = uuid.uuid4().hex[:8]
    try:
        if todo:
            with client_for(cluster) as client:
                summary["dashboard"] = dashboard(client)
                if summary["dashboard"] and progress:
                    print(f"Dask dashboard: {summary['dashboard']}", file=sys.stderr)
                futures = {client.submit(run_point, sweep.kind, sweep.target, p, str(folder), run,
                                         key=f"point-{p.id}-{run}", pure=False): p for p in todo}
                with tqdm(total=len(points), initial=summary["skipped"], desc="sweep", unit="point",
                          disable=not progress) as bar:
                    summary.update(_wait_all(client, futures, folder, bar, run))
    finally:
        summary["table"] = str(store.write_table(folder))
    return summary


def describe(r: dict, folder) -> str:
    return (f"{r['points']} points: {r['skipped']} complete already, {r['done']} done now, {r['failed']} failed; "
            f"table: {r['table']} (report: lessonkit sweep report {folder})")


def run_serial(sweep: Sweep, folder: str | Path) -> dict:
    """The same points one after another in this process, no Dask: the baseline the speed-up is measured on."""
    sweep, points = plan(sweep)
    folder = store.prepare(Path(folder).resolve(), sweep, points)
    run = uuid.uuid4().hex[:8]
    rows = [run_point(sweep.kind, sweep.target, p, str(folder), run) for p in points]
    store.write_table(folder)
    return {"points": len(points), "failed": sum(r["status"] == "failed" for r in rows), "folder": str(folder)}
