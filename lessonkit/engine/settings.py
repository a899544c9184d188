"""The run's settings in one object: which kernel path, numerics, threads, weights and forward a process takes.

`RunSettings` is what a run was asked for, as the user wrote it (normalised: stripped, lower case, "auto" when
unset); the module that acts on a setting checks it and says why it chose what it did (engine.kernel for the
path and numerics, engine.packed_layout for the weights, engine.c_plan for the forward). `from_env()` is the
one reader of the LESSONKIT_* variables that choose them (tests/test_settings.py holds it so), and `default()`
the one place the thread count of a command that was given no --threads is decided. `current()` is from_env()
with what `lessonkit.engine.active.use` asked for inside its block; `use` changes every setting in one place.

Like llama.cpp's `llama_context_default_params()`: one function for the defaults, one struct for the choice.
"""
from __future__ import annotations

import functools
import os
from dataclasses import asdict, dataclass, fields, replace
from typing import Mapping

from lessonkit.errors import LessonkitError

# The variable that chooses each setting (docs/cli.md): the only names from_env reads.
ENV = {"kernel": "LESSONKIT_KERNEL", "numerics": "LESSONKIT_NUMERICS", "threads": "LESSONKIT_THREADS",
       "weights": "LESSONKIT_WEIGHTS", "forward": "LESSONKIT_FORWARD"}
RETIRED = "LESSONKIT_ISA"          # the kernel path's old second setting: refused by name
KERNEL_CHOICES = ("auto", "avx512", "avx2", "neon", "portable", "mkl")
STARTING_THREADS = 1               # a process (tests, notebooks: shared cores) starts the kernel on one thread


@dataclass(frozen=True)
class RunSettings:
    """kernel: auto|avx512|avx2|neon|portable|mkl; numerics: auto|exact|int8; threads: the C kernel's count
    (None: not asked); weights: auto|native|f32|q8_0; forward: auto|c|torch. Checked where they are acted on."""
    kernel: str = "auto"
    numerics: str = "auto"
    threads: int | None = None
    weights: str = "auto"
    forward: str = "auto"


FIELDS = tuple(f.name for f in fields(RunSettings))


def _word(environ: Mapping[str, str], name: str) -> str:
    return environ.get(ENV[name], "").strip().lower() or "auto"


def _threads(environ: Mapping[str, str]) -> int | None:
    """LESSONKIT_THREADS=N: a user's override of the count a process starts with (None: unset)."""
    raw = environ.get(ENV["threads"], "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise LessonkitError(f"LESSONKIT_THREADS={raw!r}: expected a positive integer (the kernel's thread count)")
    return int(raw)


def from_env(environ: Mapping[str, str] | None = None) -> RunSettings:
    """The settings the LESSONKIT_* variables ask for (environ: os.environ). Refuses the retired LESSONKIT_ISA
    and a thread count that is not a positive integer; the other values are checked where they are acted on
    (a path needs the CPU and the kernel binary to be judged)."""
    environ = os.environ if environ is None else environ
    old = environ.get(RETIRED, "").strip()
    if old:
        raise LessonkitError(f"{RETIRED}={old!r}: the kernel path has one setting now, LESSONKIT_KERNEL "
                             f"({', '.join(KERNEL_CHOICES)})")
    return RunSettings(kernel=_word(environ, "kernel"), numerics=_word(environ, "numerics"),
                       threads=_threads(environ), weights=_word(environ, "weights"), forward=_word(environ, "forward"))


def parameter(asked: RunSettings) -> dict:
    """The settings as the one papermill parameter `lessonkit run` hands each notebook (SETTINGS): a plain dict
    of the five fields, which a notebook gives `lessonkit.engine.active.adopt`."""
    return asdict(asked)


def from_parameter(value: Mapping | None) -> RunSettings:
    """A notebook's SETTINGS parameter as RunSettings: a mapping of some of the five fields (a researcher's
    `papermill -y 'SETTINGS: {numerics: int8, threads: 2}'`), the others "auto" (threads None); None asks nothing.
    One error naming what is wrong: not a mapping, an unknown field, a thread count that is no positive integer."""
    if value is None:
        return RunSettings()
    if not isinstance(value, Mapping):
        raise LessonkitError(f"SETTINGS={value!r}: expected a mapping of {', '.join(FIELDS)} (or None)")
    unknown = sorted(set(value) - set(FIELDS))
    if unknown:
        raise LessonkitError(f"SETTINGS: unknown setting {unknown[0]!r}: expected some of {', '.join(FIELDS)}")
    threads = value.get("threads")
    if threads is not None and (not isinstance(threads, int) or isinstance(threads, bool) or threads < 1):
        raise LessonkitError(f"SETTINGS: threads={threads!r}: expected a positive integer (the kernel's thread count)")
    words = {k: str(v).strip().lower() or "auto" for k, v in value.items() if k != "threads" and v is not None}
    return RunSettings(**words, threads=threads)


def physical_cores() -> int:
    """Physical cores this process may use: psutil's count of physical cores (Linux, macOS, Windows), at most
    the CPUs this process is allowed on where the OS says."""
    import psutil
    cores = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    if hasattr(os, "sched_getaffinity"):
        cores = min(cores, len(os.sched_getaffinity(0)))
    return max(1, cores)


@functools.lru_cache(maxsize=1)
def default() -> RunSettings:
    """What a command runs with when it is asked nothing, decided once per process: every choice automatic and
    the kernel on this machine's physical cores (--threads of generate, bench and run, left out)."""
    return RunSettings(threads=physical_cores())


_ASKED: dict[str, object] = {}     # what `active.use` asks for inside its block, over the environment


def current() -> RunSettings:
    """from_env() with what the `use` blocks around this call ask for."""
    return replace(from_env(), **_ASKED)


def ask(name: str, value) -> object:
    """Set one setting for `current()` (value None: the environment's again); returns the one it replaces.
    Only `lessonkit.engine.active.use` calls it."""
    if name not in FIELDS:
        raise ValueError(f"unknown setting {name!r}: expected one of {', '.join(FIELDS)}")
    old = _ASKED.pop(name, None)
    if value is not None:
        _ASKED[name] = value
    return old
