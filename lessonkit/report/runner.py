"""The main job: execute every lesson notebook headlessly (papermill) into build/, keep every figure as
a PNG, and write build/summary.json (every figure each lesson recorded) with build/report.html and
build/summary.md (the report: lessonkit.report.html)."""
from __future__ import annotations

import base64
import contextlib
import json
import math
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from tqdm.auto import tqdm

from lessonkit.files.resources import workbook_path
from lessonkit.errors import LessonkitError

if TYPE_CHECKING:
    from lessonkit.engine.settings import RunSettings

NOTEBOOKS = workbook_path("notebooks")


def lesson_notebooks(folder: Path = NOTEBOOKS) -> list[Path]:
    """The lessons of the main job: NN_name.ipynb, and a lesson's sequel NNx_name.ipynb (01b after 01)."""
    return sorted(p for p in folder.glob("[0-9][0-9]*_*.ipynb") if re.fullmatch(r"\d\d[a-z]?_\w+", p.stem))


def run_parameters(*, smoke: bool, build_dir: Path, settings: RunSettings | None = None) -> dict:
    """What `lessonkit run` tells a notebook, as papermill parameters (never environment variables): each
    lesson's parameters cell declares them with None defaults (the library's own defaults).
    BUILD_DIR: where record_results writes results/<lesson>.json; SETTINGS: the run's settings, one dict
    (engine.settings.parameter: kernel path, numerics, threads, weights, forward), which the notebook hands
    lessonkit.engine.active.adopt (None: the library's)."""
    from lessonkit.engine.settings import parameter
    return {"SMOKE": smoke, "INTERACTIVE": False, "BUILD_DIR": str(Path(build_dir).resolve()),
            "SETTINGS": None if settings is None else parameter(settings)}


def execute_notebook(nb: Path, out: Path, *, smoke: bool, build_dir: Path, settings: RunSettings | None = None,
                     kernel: str = "python3", timeout: int = 1800, extra: dict | None = None,
                     progress: dict | bool = False) -> None:
    """Execute one notebook with papermill. progress: False, or tqdm arguments for a bar over its cells.
    The kernel logs errors only: its start-up warning about local TCP sockets is not a student's concern."""
    import papermill as pm
    parameters = {**run_parameters(smoke=smoke, build_dir=build_dir, settings=settings), **(extra or {})}
    pm.execute_notebook(str(nb), str(out), parameters=parameters, cwd=str(nb.parent), kernel_name=kernel,
                        progress_bar=progress, execution_timeout=timeout,
                        extra_arguments=["--IPKernelApp.log_level=ERROR"])


def extract_figures(executed: Path, fig_dir: Path) -> list[Path]:
    nb = json.loads(executed.read_text(encoding="utf-8"))
    fig_dir.mkdir(parents=True, exist_ok=True)
    paths, n = [], 0
    for cell in nb.get("cells", []):
        for o in cell.get("outputs", []):
            png = o.get("data", {}).get("image/png")
            if png:
                n += 1
                p = fig_dir / f"{executed.stem}_fig{n:02d}.png"
                p.write_bytes(base64.b64decode(png if isinstance(png, str) else "".join(png)))
                paths.append(p)
    return paths


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


def write_summary(build_dir: Path, status: dict[str, dict], *, smoke: bool = False, total_s: float | None = None) -> None:
    """build/summary.json (every recorded figure, for `lessonkit compare`), then build/report.html and
    build/summary.md (lessonkit.report.html: the same figures in sentences, tables and pictures)."""
    from lessonkit.report.html import recorded_results, write_report
    results = recorded_results(build_dir)
    total_s = sum(s["seconds"] for s in status.values()) if total_s is None else total_s
    report = write_report(build_dir, status, smoke=smoke, total_s=total_s)
    said = {e["name"]: e["sentences"] for e in report["lessons"]}
    (build_dir / "summary.json").write_text(json.dumps(
        {"machine": report["machine"], "smoke": smoke, "seconds": total_s,
         "lessons": {n: {"status": s["status"], "seconds": s["seconds"],
                         "figures": results.get(n, {}).get("figures", {}), "headline": said.get(n, []),
                         "table": results.get(n, {}).get("table")}
                     for n, s in status.items()}}, indent=2), encoding="utf-8")


def _described(settings: RunSettings | None):
    """The run's settings in force in this process while the report describes the machine (each lesson adopted them
    from its SETTINGS parameter; without this the report named this process's own, e.g. exact numerics for a run
    of `lessonkit run --numerics int8`)."""
    from dataclasses import asdict

    from lessonkit.engine import active
    if settings is None:
        return contextlib.nullcontext()
    return active.use("the run's settings", **{k: None if v == "auto" else v for k, v in asdict(settings).items()})


def run_all(build_dir: str | Path = "build", smoke: bool = False, only: list[str] | None = None,
            settings: RunSettings | None = None) -> int:
    """Execute the lessons (those whose name contains one of `only`) into build_dir; settings: what each notebook
    runs with (its SETTINGS parameter; None: the library's). Returns 1 if any lesson failed."""
    build_dir = Path(build_dir)
    (build_dir / "notebooks").mkdir(parents=True, exist_ok=True)
    nbs = [p for p in lesson_notebooks() if not only or any(o in p.name for o in only)]
    if not nbs:
        raise LessonkitError(f"no lesson notebooks found in {NOTEBOOKS}" + (f" matching {only}" if only else ""))
    status: dict[str, dict] = {}
    failed = []
    start = time.perf_counter()
    for nb in (bar := tqdm(nbs, desc="lessons", unit="notebook", position=0)):
        bar.set_postfix_str(nb.stem)
        out = build_dir / "notebooks" / nb.name
        t0 = time.perf_counter()
        try:
            execute_notebook(nb, out, smoke=smoke, build_dir=build_dir, settings=settings,
                             progress={"desc": f"  {nb.stem}", "position": 1, "leave": False})
            st = "ok"
        except Exception as e:  # papermill raises PapermillExecutionError with the cell's traceback
            st = "FAILED"
            failed.append(nb.name)
            print(f"\n{nb.name} failed: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
        figs = extract_figures(out, build_dir / "figures") if out.exists() else []
        status[nb.stem] = {"status": st, "seconds": time.perf_counter() - t0, "figures": figs}
    with _described(settings):                  # the report's machine table: what the lessons ran with
        write_summary(build_dir, status, smoke=smoke, total_s=time.perf_counter() - start)
    print(f"executed {len(nbs) - len(failed)}/{len(nbs)} lessons; report: {build_dir / 'report.html'} "
          f"(and {build_dir / 'summary.md'})")
    return 1 if failed else 0


def load_summary_figures(p: str | Path) -> dict[str, dict]:
    """{lesson: {figure: value}} of a build/summary.json; one LessonkitError naming the file when it is
    not one (not UTF-8 JSON, nested too deeply, a list where an object belongs, ...)."""
    from lessonkit.files.safe_files import load_json_file
    data = load_json_file(p, "lessonkit summary.json")
    lessons = data.get("lessons") if isinstance(data, dict) else None
    if not isinstance(lessons, dict):
        raise LessonkitError(f"{p}: not a lessonkit summary.json (expected an object with a 'lessons' object)")
    out = {}
    for name, lesson in lessons.items():
        figs = lesson.get("figures", {}) if isinstance(lesson, dict) else None
        if not isinstance(figs, dict):
            raise LessonkitError(f"{p}: not a lessonkit summary.json (lesson {name!r} or its figures is not an object)")
        out[name] = figs
    return out


def figure_moved(va, vb, rel_noise: float) -> str | None:
    """'old -> new (change)' when a figure moved beyond rel_noise, else None. A figure that becomes NaN,
    leaves NaN, or goes from or to +-Infinity has moved (a relative change cannot say how far)."""
    def num(v):
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if not (num(va) and num(vb)):
        return None if va == vb else f"{va!r} -> {vb!r}"
    try:
        fa, fb = float(va), float(vb)
    except OverflowError:                       # integers beyond a float: only equality is meaningful
        return None if va == vb else f"{va} -> {vb}"
    if math.isfinite(fa) and math.isfinite(fb):
        rel = (fb - fa) / max(abs(fa), 1e-12)
        return f"{_fmt(va)} -> {_fmt(vb)} ({rel:+.1%})" if abs(rel) > rel_noise else None
    if fa == fb or (math.isnan(fa) and math.isnan(fb)):
        return None
    return f"{_fmt(va)} -> {_fmt(vb)} (not a finite change)"


def compare_summaries(old: str | Path, new: str | Path, rel_noise: float = 0.1) -> int:
    """Print every figure that moved by more than rel_noise (relative), became or stopped being NaN or
    infinite, or changed a non-numeric value; exit 1 if any did."""
    a, b = load_summary_figures(old), load_summary_figures(new)
    moved = 0
    for lesson in sorted(set(a) | set(b)):
        fa, fb = a.get(lesson, {}), b.get(lesson, {})
        for k in sorted(set(fa) | set(fb)):
            change = figure_moved(fa.get(k), fb.get(k), rel_noise)
            if change is not None:
                moved += 1
                print(f"{lesson}.{k}: {change}")
    print(f"{moved} figure(s) moved beyond {rel_noise:.0%}" if moved else f"nothing moved beyond {rel_noise:.0%}")
    return 1 if moved else 0
