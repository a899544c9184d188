"""Sweeps on a real Dask cluster: a `dask scheduler` and two `dask worker` processes started here on localhost,
a sweep through --scheduler, a worker killed mid-sweep, a sweep stopped and resumed, a failing point, and bad
grids refused before anything runs. The points are noop points of known work, whose checksum the test computes
itself (tests/test_sweep.py's expected_checksum)."""
from __future__ import annotations

import csv
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from lessonkit.cli import main
from lessonkit.sweep import store
from lessonkit.sweep.cluster import ClusterConfig
from lessonkit.sweep.grid import Sweep
from lessonkit.sweep.run import run_sweep

DASK = str(Path(sys.executable).with_name("dask"))
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def expected_checksum(work: int, value: int) -> int:
    acc = 0
    for i in range(work):
        acc = (acc * 31 + i) % 1_000_003
    return acc + value


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalDask:
    """A scheduler and n workers, each its own process group (so a kill takes a worker's children too)."""

    def __init__(self, n_workers: int = 2):
        self.address = f"tcp://127.0.0.1:{_free_port()}"
        port = self.address.rsplit(":", 1)[1]
        self.scheduler = self._start([DASK, "scheduler", "--host", "127.0.0.1", "--port", port, "--no-dashboard"])
        self.workers = [self._start([DASK, "worker", self.address, "--nthreads", "1", "--nworkers", "1",
                                     "--no-dashboard", "--name", f"w{i}"]) for i in range(n_workers)]
        from distributed import Client
        with Client(self.address, timeout="60s") as c:
            c.wait_for_workers(n_workers, timeout=60)
            self.worker_addresses = {info["name"]: a for a, info in c.scheduler_info()["workers"].items()}

    @staticmethod
    def _start(cmd):
        return subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)

    def kill_worker(self, i: int) -> None:
        os.killpg(self.workers[i].pid, signal.SIGKILL)
        self.workers[i].wait(timeout=30)

    def close(self) -> None:
        for p in [*self.workers, self.scheduler]:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in [*self.workers, self.scheduler]:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def dask_cluster():
    cluster = LocalDask(2)
    yield cluster
    cluster.close()


def _table(folder: Path) -> list[dict]:
    with open(folder / "results.csv", newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _check_rows(folder: Path, n: int, work: int) -> list[dict]:
    """n whole rows, one per point, every checksum right; every row file parses."""
    rows = _table(folder)
    assert len(rows) == n and len({r["id"] for r in rows}) == n
    for r in rows:
        assert r["status"] == "ok", r
        assert int(r["checksum"]) == expected_checksum(int(r.get("work") or work), int(r["value"]))
    for f in (folder / "points").glob("*.json"):
        assert json.loads(f.read_text(encoding="utf-8"))["id"] == f.stem
    return rows


def _rows_written(folder: Path) -> int:
    return len(list((folder / "points").glob("*.json")))


def test_a_sweep_through_scheduler_then_its_report_and_compare(dask_cluster, tmp_path, capsys):
    out = tmp_path / "s"
    rc = main(["sweep", "run", "noop", "--grid", "value=1,2,3", "--grid", "work=1000,2000", "--repeats", "2",
               "--scheduler", dask_cluster.address, "--results", str(out), "--json"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["points"] == 12 and summary["done"] == 12 and summary["failed"] == 0
    rows = _check_rows(out, 12, 0)
    assert {r["worker"] for r in rows} <= set(dask_cluster.worker_addresses.values())
    assert main(["sweep", "report", str(out)]) == 0
    html = (out / "report.html").read_text(encoding="utf-8")
    assert html.count("data:image/png;base64,") == 3          # checksum, work_s, cpu_s, each over work x value
    assert main(["compare", str(out), str(out)]) == 0
    capsys.readouterr()


def test_a_failing_point_is_recorded_and_stops_nothing(dask_cluster, tmp_path, capsys):
    out = tmp_path / "f"
    argv = ["sweep", "run", "noop", "--grid", "fail=false,true", "--grid", "value=7,8", "--set", "work=10",
            "--scheduler", dask_cluster.address, "--results", str(out), "--json"]
    assert main(argv) == 1
    rows = _table(out)
    failed = [r for r in rows if r["status"] == "failed"]
    assert len(rows) == 4 and len(failed) == 2
    assert all("fails on purpose" in r["error"] for r in failed)
    assert all(int(r["checksum"]) == expected_checksum(10, int(r["value"])) for r in rows if r["status"] == "ok")
    capsys.readouterr()
    assert main(argv) == 1                                   # a rerun runs the failed points only
    again = json.loads(capsys.readouterr().out)
    assert again["skipped"] == 2 and again["ran"] == 2 and again["failed"] == 2


def test_a_grid_file_with_command_line_values_over_it(dask_cluster, tmp_path, capsys):
    f = tmp_path / "grid.yaml"
    f.write_text("grid:\n  value: [1, 2, 3]\nset:\n  work: 100\nrepeats: 2\n", encoding="utf-8")
    assert main(["sweep", "run", "noop", "--grid-file", str(f), "--grid", "value=5,6", "--scheduler",
                 dask_cluster.address, "--results", str(tmp_path / "o"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["points"] == 4            # --grid value=5,6 over the file's, 2 repeats
    rows = _check_rows(tmp_path / "o", 4, 100)
    assert sorted(int(r["value"]) for r in rows) == [5, 5, 6, 6] and {r["repeat"] for r in rows} == {"0", "1"}


def test_a_killed_worker_loses_nothing(tmp_path):
    from distributed import Client
    cluster = LocalDask(2)
    observer = Client(cluster.address, timeout="30s")
    try:
        out, n, work = tmp_path / "k", 10, 400_000
        sweep = Sweep("noop", None, {"value": list(range(n))}, {"work": work})
        result = {}
        t = threading.Thread(target=lambda: result.update(
            run_sweep(sweep, out, ClusterConfig(scheduler=cluster.address), progress=False)))
        t.start()
        deadline = time.time() + 60
        while (not (out / "points").exists() or _rows_written(out) < 2) and time.time() < deadline:
            time.sleep(0.05)
        victim, survivor = cluster.worker_addresses["w0"], cluster.worker_addresses["w1"]
        in_flight = {key.split("-")[1] for key in observer.processing(workers=[victim])[victim]}
        killed_at = _rows_written(out)
        cluster.kill_worker(0)
        assert killed_at < n and in_flight, "nothing left to kill: make the points longer"
        t.join(timeout=120)
        assert not t.is_alive()
        assert result["failed"] == 0 and result["done"] == n
        rows = {r["id"]: r for r in _check_rows(out, n, work)}
        assert any(rows[pid]["worker"] == survivor for pid in in_flight)     # the killed point ran again elsewhere
    finally:
        observer.close()
        cluster.close()


def test_stop_and_resume(dask_cluster, tmp_path):
    out, n, work = tmp_path / "r", 12, 300_000
    cmd = [sys.executable, "-m", "lessonkit", "sweep", "run", "noop", "--grid",
           "value=" + ",".join(map(str, range(n))), "--set", f"work={work}", "--scheduler", dask_cluster.address,
           "--results", str(out)]
    # the child gets SIGINT's default back: something earlier in the suite's process (a library) can leave SIGINT
    # ignored, and an ignored signal stays ignored across exec, so the sweep would never see the Ctrl-C
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)) if os.name == "posix" else None)
    deadline = time.time() + 60
    while (not (out / "points").exists() or _rows_written(out) < 2) and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    time.sleep(1.0)                                          # points still running when it stopped may finish
    first = {r["id"]: r["run"] for r in map(json.loads, (f.read_text() for f in (out / "points").glob("*.json")))}
    assert 2 <= len(first) < n, "stopped too late: nothing left to resume"
    summary = run_sweep(Sweep("noop", None, {"value": list(range(n))}, {"work": work}), out,
                        ClusterConfig(scheduler=dask_cluster.address), progress=False)
    assert summary["skipped"] >= len(first) and summary["failed"] == 0
    rows = _check_rows(out, n, work)
    assert all(r["run"] == first[r["id"]] for r in rows if r["id"] in first)     # not run again
    assert len({r["run"] for r in rows}) == 2


@pytest.mark.parametrize("argv, named", [
    (["noop", "--grid", "wokr=1,2"], "'wokr'"),
    (["noop", "--grid", "work="], "'work': an empty value list"),
    (["noop", "--grid", "work=1,abc"], "'work': 'abc' is not an integer"),
    (["noop", "--set", "fail=maybe"], "'fail': 'maybe' is not true or false"),
    (["noop", "--grid", "value=1,1"], "'value': a value is listed twice"),
    (["lesson:01", "--grid", "K=2,four"], "'K': 'four' is not an integer"),
    (["lesson:01", "--grid", "BUILD_DIR=x"], "'BUILD_DIR'"),
    (["bench:nosuch"], "'nosuch' is not a bench"),
    (["nosuch:x"], "the kind 'nosuch'"),
])
def test_a_bad_grid_is_one_error_naming_it_before_anything_runs(tmp_path, capsys, argv, named):
    out = tmp_path / "bad"
    assert main(["sweep", "run", *argv, "--results", str(out), "--scheduler", "tcp://127.0.0.1:1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("lessonkit: error:") and named in err[0], err
    assert not out.exists()


@pytest.mark.parametrize("text, named", [
    ("grid:\n  work: [1, x]\n", "'work': 'x' is not an integer"),
    ("grid:\n  work: [true]\n", "'work': True is not an integer"),
    ("grid:\n  work: []\n", "'work': an empty value list"),
    ("grid: [1, 2]\n", "a grid file is an object"),
])
def test_a_bad_grid_file_is_one_error(tmp_path, capsys, text, named):
    f = tmp_path / "grid.yaml"
    f.write_text(text, encoding="utf-8")
    assert main(["sweep", "run", "noop", "--grid-file", str(f), "--results", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and named in err[0], err
    assert not (tmp_path / "o").exists()


def test_a_folder_that_is_not_a_sweep_is_left_alone(tmp_path, capsys):
    (tmp_path / "mine.txt").write_text("keep", encoding="utf-8")
    assert main(["sweep", "run", "noop", "--grid", "value=1", "--results", str(tmp_path)]) == 2
    assert "holds no sweep.json" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.txt"]


def test_slurm_without_dask_jobqueue_is_one_error_before_anything_runs(tmp_path, capsys):
    import importlib.util
    if importlib.util.find_spec("dask_jobqueue") is not None:
        pytest.skip("dask-jobqueue is installed here: --slurm would submit jobs")
    assert main(["sweep", "run", "noop", "--grid", "value=1", "--slurm", "--results", str(tmp_path / "o")]) == 2
    assert "pip install 'lessonkit[slurm]'" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_the_bench_parameters_are_the_bench_commands_options():
    """Both come from one table (lessonkit.bench.OPTIONS): every option of `lessonkit bench` but --json (and
    --help) is a sweep parameter, with the command's default."""
    from lessonkit.cli import build_parser
    from lessonkit.sweep.points import BENCH_PARAMS
    bench = build_parser()._subparsers._group_actions[0].choices["bench"]
    options = {a.dest: a.default for a in bench._actions if a.option_strings and a.dest not in ("json", "help")}
    assert set(BENCH_PARAMS) == set(options), set(BENCH_PARAMS) ^ set(options)
    assert {n: p.default for n, p in BENCH_PARAMS.items()} == options


def test_a_local_cluster_sweep_and_the_serial_loop_agree(tmp_path):
    from lessonkit.sweep.run import run_serial
    sweep = Sweep("noop", None, {"value": [3, 4]}, {"work": 5000})
    assert run_sweep(sweep, tmp_path / "local", ClusterConfig(workers=2), progress=False)["done"] == 2
    run_serial(sweep, tmp_path / "serial")
    a, b = _table(tmp_path / "local"), _table(tmp_path / "serial")
    assert [(r["id"], r["checksum"]) for r in a] == [(r["id"], r["checksum"]) for r in b]
    assert {r["worker"].split(":")[0] for r in a} == {"tcp"} and {r["worker"].split(":")[0] for r in b} == {"local"}
