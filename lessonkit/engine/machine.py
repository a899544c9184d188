"""The machine the figures come from: the CPU's name as the OS reports it (benchmarks and lessons print it
beside every time they measure), and the one machine record every bench, the report, a training log and a
sweep's rows carry. In the engine room, beside the settings it describes, so that training (below measure) keeps
the same record."""
from __future__ import annotations

import platform
import subprocess
import sys


def cpu_name() -> str:
    """The CPU's model name as the OS reports it (/proc/cpuinfo, sysctl on macOS, else platform)."""
    try:
        if sys.platform.startswith("linux"):
            with open("/proc/cpuinfo", encoding="utf-8") as f:
                info = {}
                for line in f:
                    key, _, val = line.partition(":")
                    info.setdefault(key.strip(), val.strip())
            flags = set(info.get("flags", "").split())
            isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else None
            name = info.get("model name") or info.get("Model") or platform.machine()
            fam = f"family {info['cpu family']} model {info['model']}" if "cpu family" in info else ""
            return ", ".join(x for x in (name, fam, isa) if x)
        if sys.platform == "darwin":
            import subprocess
            return subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                                  encoding="utf-8",
                                  timeout=5).stdout.strip() or platform.machine()
    except (OSError, KeyError, ValueError):
        pass
    return platform.processor() or platform.machine()


def machine_record(*, refuse_bad_weights: bool = True, engine: bool = True) -> dict:
    """The one machine record: the CPU and its cores, versions, and the settings in force with why each was
    chosen (lessonkit.engine.active.describe). Every bench's "machine" (lessonkit.bench.common), the report's
    first table (lessonkit.report.html), every training log and every sweep row are this record. A
    LESSONKIT_WEIGHTS the engine refuses raises unless refuse_bad_weights is False (the report, which says so:
    the run said it first). engine=False: the machine alone, without torch and the settings (a sweep's no-op
    points and its calibration measure the sweep engine, which loads neither)."""
    import os

    import psutil

    from lessonkit.engine.settings import physical_cores
    host = {"cpu": cpu_name(), "python": platform.python_version(), "cpu_count": os.cpu_count(),
            "physical_cores": physical_cores(), "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(), "cores_in_machine": psutil.cpu_count(logical=False),
            "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None}
    if not engine:
        return host
    import torch

    from lessonkit.engine.active import describe
    from lessonkit.errors import LessonkitError
    d = describe()
    if d["weights"] is None and refuse_bad_weights:
        raise LessonkitError(d["weights_why"])
    return {**host, "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "kernel": d["backend"], "isa": d["isa"], "numerics": d["numerics"], "vnni": d["vnni"],
            "kernel_threads": d["threads"], "weights": d["weights"], "kernel_why": d["why"],
            "numerics_why": d["numerics_why"], "weights_why": d["weights_why"], "forward": d["forward"]}
