"""The machine the figures come from: the CPU's name as the OS reports it (benchmarks and lessons print it
beside every time they measure)."""
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
