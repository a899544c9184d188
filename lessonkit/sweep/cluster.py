"""The Dask client a sweep submits to: a LocalCluster sized to the machine (one single-threaded worker process per
physical core, so each point runs alone in its process), an existing cluster (`--scheduler tcp://HOST:8786`), or
Slurm jobs started by dask-jobqueue (`--slurm`, the optional extra lessonkit[slurm]; docs/sweep.md has a worked
example). Dask's dashboard, when one is up, is at client.dashboard_link."""
from __future__ import annotations

import contextlib
import importlib.util
import logging
from dataclasses import dataclass

from lessonkit.engine.settings import physical_cores
from lessonkit.errors import LessonkitError


@dataclass
class ClusterConfig:
    """scheduler: an existing scheduler's address; slurm: start workers as Slurm jobs; workers: how many (local
    worker processes or Slurm jobs; default: the physical cores, or 2 jobs); the rest: each Slurm job's size."""
    scheduler: str | None = None
    workers: int | None = None
    slurm: bool = False
    slurm_memory: str = "4GB"
    slurm_walltime: str = "01:00:00"
    slurm_queue: str | None = None


def local_cluster(n: int):
    from distributed import LocalCluster
    dashboard = ":0" if importlib.util.find_spec("bokeh") else None     # Dask's dashboard needs bokeh
    return LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=dashboard,
                        silence_logs=logging.ERROR)


def check(cfg: ClusterConfig) -> None:
    """What can be said about the cluster before anything runs (nothing is started or connected here)."""
    if cfg.scheduler and cfg.slurm:
        raise LessonkitError("--scheduler and --slurm exclude each other (a Slurm sweep starts its own scheduler)")
    if cfg.slurm and importlib.util.find_spec("dask_jobqueue") is None:
        raise LessonkitError("--slurm needs dask-jobqueue: pip install 'lessonkit[slurm]' (docs/sweep.md)")


def _slurm_cluster(cfg: ClusterConfig):
    from dask_jobqueue import SLURMCluster
    cluster = SLURMCluster(cores=1, processes=1, memory=cfg.slurm_memory, walltime=cfg.slurm_walltime,
                           queue=cfg.slurm_queue)
    cluster.scale(jobs=cfg.workers or 2)
    return cluster


@contextlib.contextmanager
def client_for(cfg: ClusterConfig):
    """A connected distributed.Client; the cluster it started (if any) is closed on the way out."""
    from distributed import Client
    check(cfg)
    if cfg.scheduler:
        try:
            client = Client(cfg.scheduler, timeout="20s")
        except (OSError, ValueError) as e:
            raise LessonkitError(f"--scheduler {cfg.scheduler}: no Dask scheduler answered ({e})") from None
        with client:
            yield client
        return
    cluster = _slurm_cluster(cfg) if cfg.slurm else local_cluster(cfg.workers or physical_cores())
    with cluster, Client(cluster) as client:
        yield client


def dashboard(client) -> str | None:
    """The dashboard's address, when the scheduler serves one and bokeh (which draws it) is installed here."""
    if importlib.util.find_spec("bokeh") is None:
        return None
    try:
        return client.dashboard_link if client.scheduler_info().get("services", {}).get("dashboard") else None
    except (KeyError, AttributeError):
        return None
