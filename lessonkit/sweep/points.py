"""What a point of a sweep can be: POINT_KINDS, one entry per kind, each with the parameters it declares
(checked before anything runs) and how one point runs, returning its figures (name -> number or text).

  lesson      a lesson notebook run by papermill with the parameters (its `parameters` cell declares them) and
              the run's settings (kernel, numerics, threads, weights, forward: its SETTINGS parameter);
              figures: what its last cell recorded (lessons.results.record_results)
  bench       `lessonkit bench NAME --json` in its own process; figures: the JSON's scalar numbers
  break-even  one measured cell of lesson 1's break-even surface: plain and speculative greedy (the oracle
              drafter at the given acceptance) with experts read from a disk (measure.break_even.measured_cell);
              target: the model (default tiny-moe)
  noop        nothing, or `work` iterations of busy arithmetic: what measures the sweep engine itself
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from lessonkit.bench import OPTIONS as BENCH_OPTIONS
from lessonkit.errors import LessonkitError
from lessonkit.sweep.grid import ANY, Param

# the sweep sets these for a lesson itself: they are no grid parameters (SETTINGS: from LESSON_SETTINGS)
LESSON_RESERVED = ("BUILD_DIR", "INTERACTIVE", "SETTINGS")
# a lesson's run settings (engine.settings.RunSettings, handed to it as its one SETTINGS parameter) as parameters
LESSON_SETTINGS = {
    "kernel": Param(str, "auto", "C kernel path"), "numerics": Param(str, "auto", "exact or int8"),
    "threads": Param(int, 1, "C kernel threads"), "weights": Param(str, "auto", "native, f32 or q8_0"),
    "forward": Param(str, "auto", "c or torch"),
}
# the bench options (lessonkit.bench.OPTIONS, the CLI's table) as parameters: one thread count per point
BENCH_TYPES = {"flag": bool, "text": str, "repeats": int, "thread counts": int, "disk": str, "numerics": str}
BENCH_PARAMS = {name: Param(BENCH_TYPES[kind], default, why or name)
                for name, (kind, default, why) in BENCH_OPTIONS.items()}
BREAK_EVEN_PARAMS = {
    "budget_experts": Param(int, 2, "experts resident (0: all)"), "acceptance": Param(float, 1.0, "oracle acceptance"),
    "k": Param(int, 2, "draft depth"), "disk": Param(str, "warm", "warm, cold or simulated:MB/s"),
    "max_new_tokens": Param(int, 8, "new tokens per run"), "prompts": Param(int, 1, "prompts per run"),
    "seed": Param(int, 0, "which prompts"), "threads": Param(int, 1, "C kernel threads"),
}
NOOP_PARAMS = {
    "work": Param(int, 0, "iterations of busy arithmetic (0: a no-op)"), "value": Param(int, 0, "any label"),
    "fail": Param(bool, False, "raise instead (a failing point)"),
}


@dataclass(frozen=True)
class PointKind:
    """params(target) -> declared parameters; run(target, params, out_dir) -> figures; needs_target: the
    kind names a lesson, bench or model after its colon (noop takes none); lead: the measured figures a sweep's
    report draws first, in this order; restated: figures that only restate a parameter (never drawn)."""
    params: Callable[[str | None], dict[str, Param]]
    run: Callable[[str | None, dict, Path], dict]
    needs_target: bool
    default_target: str | None = None
    lead: tuple[str, ...] = ()
    restated: tuple[str, ...] = ()


# ---- lessons -----------------------------------------------------------------------------------------------
def lesson_notebook(target: str) -> Path:
    """The lesson whose name contains `target`; where several do, the one it names up to an underscore ("01" is
    01_speculative, not 01b_speculative_more)."""
    from lessonkit.report.runner import lesson_notebooks
    found = [p for p in lesson_notebooks() if target in p.stem]
    if len(found) > 1:
        found = [p for p in found if p.stem == target or p.stem.startswith(target + "_")] or found
    if len(found) != 1:
        names = ", ".join(p.stem for p in lesson_notebooks())
        raise LessonkitError(f"lesson {target!r} names {'no' if not found else 'more than one'} lesson ({names})")
    return found[0]


def lesson_params(target: str) -> dict[str, Param]:
    """The names assigned in the notebook's `parameters` cell, typed by their defaults (None: any scalar), and the
    run settings (LESSON_SETTINGS)."""
    nb = json.loads(lesson_notebook(target).read_text(encoding="utf-8"))
    cell = next(c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", []))
    out = {}
    for node in ast.parse("".join(cell["source"])).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            name, default = node.targets[0].id, ast.literal_eval(node.value)
            if name not in LESSON_RESERVED:
                out[name] = Param(ANY if default is None else type(default), default)
    return {**out, **LESSON_SETTINGS}


def run_lesson(target: str, params: dict, out_dir: Path) -> dict:
    from lessonkit.engine.settings import RunSettings
    from lessonkit.report.runner import execute_notebook
    nb = lesson_notebook(target)
    build = out_dir / "build"
    asked = RunSettings(**{n: params.get(n, p.default) for n, p in LESSON_SETTINGS.items()})
    execute_notebook(nb, out_dir / nb.name, smoke=bool(params.get("SMOKE", False)), build_dir=build, settings=asked,
                     extra={n: v for n, v in params.items() if n not in LESSON_SETTINGS})
    recorded = build / "results" / f"{nb.stem}.json"
    if not recorded.exists():
        raise LessonkitError(f"{nb.name} recorded no figures (no {recorded.name})")
    return scalars(json.loads(recorded.read_text(encoding="utf-8"))["figures"])


# ---- benches -----------------------------------------------------------------------------------------------
def bench_params(target: str) -> dict[str, Param]:
    from lessonkit.bench import BENCHES
    if target not in BENCHES:
        raise LessonkitError(f"bench {target!r} is not a bench ({', '.join(sorted(BENCHES))})")
    return BENCH_PARAMS


def bench_command(target: str, params: dict) -> list[str]:
    cmd = [sys.executable, "-m", "lessonkit", "bench", target, "--json"]
    for name, v in sorted(params.items()):
        if BENCH_PARAMS[name].type is bool:
            cmd += [f"--{name}"] if v else []
        elif v is not None:
            cmd += [f"--{name}", str(v)]
    return cmd


def run_bench(target: str, params: dict, out_dir: Path) -> dict:
    from lessonkit.files.atomic import atomic_write
    r = subprocess.run(bench_command(target, params), capture_output=True, text=True, encoding="utf-8")
    if r.returncode != 0:
        tail = (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1]
        raise LessonkitError(f"lessonkit bench {target} failed: {tail}")
    atomic_write(out_dir / "bench.json", r.stdout.encode("utf-8"))
    return scalars(json.loads(r.stdout))


# ---- a measured cell of lesson 1's break-even surface, and the no-op ---------------------------------------
def run_break_even(target: str, params: dict, out_dir: Path) -> dict:
    from lessonkit.engine.threads import use_threads
    from lessonkit.measure.break_even import measured_cell
    p = {n: params.get(n, d.default) for n, d in BREAK_EVEN_PARAMS.items()}
    use_threads(p.pop("threads"))
    return {n: v for n, v in scalars(measured_cell(target, **p)).items() if n not in BREAK_EVEN_PARAMS}


def run_noop(target: str | None, params: dict, out_dir: Path) -> dict:
    """`work` iterations of integer arithmetic (the same result everywhere): a CPU-bound point of known size."""
    if params.get("fail"):
        raise LessonkitError(f"this noop point fails on purpose (value {params.get('value', 0)})")
    t0, c0, acc = time.perf_counter(), time.process_time(), 0
    for i in range(int(params.get("work", 0))):
        acc = (acc * 31 + i) % 1_000_003
    return {"checksum": acc + int(params.get("value", 0)), "work_s": time.perf_counter() - t0,
            "cpu_s": time.process_time() - c0}


def scalars(obj, prefix: str = "", depth: int = 3) -> dict:
    """The numbers, booleans and short texts of a (nested) JSON object as {"a.b": value}; lists are left out."""
    out = {}
    for k, v in obj.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict) and depth > 1:
            out.update(scalars(v, f"{name}.", depth - 1))
        elif isinstance(v, (bool, int, float)) or (isinstance(v, str) and len(v) <= 80):
            out[name] = v
    return out


POINT_KINDS = {
    "lesson": PointKind(lesson_params, run_lesson, needs_target=True),
    "bench": PointKind(bench_params, run_bench, needs_target=True),
    "break-even": PointKind(lambda target: BREAK_EVEN_PARAMS, run_break_even, needs_target=False,
                            default_target="tiny-moe",
                            lead=("speedup", "tokens_per_forward", "acceptance_rate", "bytes_read_per_token"),
                            restated=("budget_frac", "error_rate")),      # budget_experts / total, 1 - acceptance
    "noop": PointKind(lambda target: NOOP_PARAMS, run_noop, needs_target=False),
}


def parse_point(text: str) -> tuple[str, str | None]:
    """'lesson:01', 'bench:kernel', 'break-even[:MODEL]', 'noop' -> (kind, target); one error naming the text."""
    kind, _, target = text.partition(":")
    if kind not in POINT_KINDS:
        raise LessonkitError(f"point {text!r}: the kind {kind!r} is not one of {', '.join(POINT_KINDS)}")
    pk = POINT_KINDS[kind]
    if pk.needs_target and not target:
        raise LessonkitError(f"point {text!r}: name the {kind} after a colon, e.g. {kind}:NAME")
    if kind == "noop" and target:
        raise LessonkitError(f"point {text!r}: noop takes no target")
    return kind, target or pk.default_target
