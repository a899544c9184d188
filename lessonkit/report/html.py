"""The main job's report: build/report.html (one self-contained page) and build/summary.md (the same in
Markdown), from what `lessonkit run` left in build/: each lesson's recorded figures and main table
(results/), its figures as PNG (figures/) and its executed notebook (notebooks/), which this module also
renders as HTML with nbconvert.

Per lesson: title, status and time, the headline sentences its module declares (lessonkit.lessons.headline),
its main table and its key figure. At the top: the machine, versions and total time."""
from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import jinja2

from lessonkit.files.resources import PACKAGE_DIR, workbook_root
from lessonkit.lessons.headline import headline_for, main_table, sentence_texts
from lessonkit.engine.machine import machine_record

TEMPLATES = PACKAGE_DIR / "report" / "templates"
VERSIONED = ("lessonkit", "torch", "numpy", "pandas", "matplotlib", "papermill", "nbconvert")


def _version(pkg: str) -> str:
    try:
        return version(pkg)
    except PackageNotFoundError:
        return "not installed"


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                             cwd=workbook_root(), encoding="utf-8")
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def machine_table() -> dict[str, str]:
    """The run's machine and software, as label -> text (the report's first table), from the one machine
    record (lessonkit.engine.machine.machine_record)."""
    m = machine_record(refuse_bad_weights=False)
    cores, logical, usable, torch_n = m["cores_in_machine"], m["cpu_count"], m["cpus_usable"], m["torch_threads"]
    info = {"CPU": m["cpu"],
            "cores": f"{cores} physical, {logical} logical" if cores else f"{logical} logical",
            "usable by this run": f"{'?' if usable is None else usable} CPUs, "
                                  f"{torch_n} torch thread{'s' if torch_n > 1 else ''}",
            "kernel path": f"{m['kernel']} ({m['kernel_why']})", "numerics": f"{m['numerics']} ({m['numerics_why']})",
            # a bad LESSONKIT_WEIGHTS: the report says so, the run said it first
            "weights path": m["weights_why"] if m["weights"] is None else f"{m['weights']} ({m['weights_why']})"}
    info["system"] = m["platform"]
    info["python"] = m["python"]
    info["versions"] = ", ".join(f"{p} {_version(p)}" for p in VERSIONED)
    commit = _git_commit()
    if commit:
        info["commit"] = commit
    return info


def duration(seconds: float) -> str:
    """"42 s", "3 min 5 s", "1 h 2 min"."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


def figure_cells(executed: Path) -> list[str]:
    """The source of the cell that drew each PNG of an executed notebook, in runner.extract_figures' order."""
    nb = json.loads(executed.read_text(encoding="utf-8"))
    out = []
    for cell in nb.get("cells", []):
        src = "".join(cell.get("source", ""))
        out += [src for o in cell.get("outputs", []) if o.get("data", {}).get("image/png")]
    return out


def key_figure(executed: Path, figures: list[Path], marker: str | None) -> Path | None:
    """The figure drawn by the first cell whose source contains marker (else the first figure, if any)."""
    if not figures:
        return None
    if marker and executed.exists():
        for src, path in zip(figure_cells(executed), figures):
            if marker in src:
                return path
    return figures[0]


def render_notebooks(build_dir: Path, names: list[str]) -> dict[str, str]:
    """Each executed notebook as build/notebooks/<name>.html (nbconvert's HTML exporter, the same as
    `jupyter nbconvert --to html`, made to work offline: no CDN script, formulas rendered to SVG, see
    lessons/offline.py); name -> its path relative to build_dir, for those that rendered."""
    import nbformat
    from nbconvert import HTMLExporter

    from lessonkit.lessons.offline import offline_page
    exporter, out = HTMLExporter(), {}
    for name in names:
        src = build_dir / "notebooks" / f"{name}.ipynb"
        if not src.exists():
            continue
        try:
            body, _ = exporter.from_notebook_node(nbformat.read(src, as_version=4))
        except Exception as e:  # a notebook that does not render still has its .ipynb link in the report
            print(f"{src.name}: not rendered as HTML ({type(e).__name__}: {e})", file=sys.stderr)
            continue
        (build_dir / "notebooks" / f"{name}.html").write_text(offline_page(body), encoding="utf-8")
        out[name] = f"notebooks/{name}.html"
    return out


def recorded_results(build_dir: Path) -> dict[str, dict]:
    """lesson -> what its notebook recorded in build/results/ (figures and main table)."""
    out = {}
    for f in sorted((build_dir / "results").glob("*.json")):
        d = json.loads(f.read_text(encoding="utf-8"))
        out[d["lesson"]] = d
    return out


def lesson_entries(build_dir: Path, status: dict[str, dict]) -> list[dict]:
    """Everything the report says about each lesson, formatted (the templates only lay it out)."""
    recorded, html = recorded_results(build_dir), render_notebooks(build_dir, list(status))
    entries = []
    for name, st in status.items():
        rec = recorded.get(name, {})
        figures, h = rec.get("figures", {}), headline_for(name)
        headers, rows = main_table(h, figures, rec.get("table"))
        pngs = [Path(p) for p in st.get("figures", [])]
        key = key_figure(build_dir / "notebooks" / f"{name}.ipynb", pngs, h.figure if h else None)
        entries.append({
            "name": name, "number": name.split("_", 1)[0], "title": h.title if h else name,
            "ok": st["status"] == "ok", "status": st["status"], "time": duration(st["seconds"]),
            "sentences": sentence_texts(h, figures), "caption": h.caption if h else "",
            "headers": headers, "rows": rows,
            "key_figure": f"figures/{key.name}" if key else None,
            "key_figure_data": base64.b64encode(key.read_bytes()).decode() if key else None,
            "figures": [f"figures/{p.name}" for p in pngs],
            "notebook_html": html.get(name), "notebook": f"notebooks/{name}.ipynb"})
    return entries


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=jinja2.select_autoescape(["html"]),
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                             undefined=jinja2.StrictUndefined)
    env.filters["md_cell"] = lambda v: str(v).replace("|", "\\|").replace("\n", " ")
    return env


def write_report(build_dir: Path, status: dict[str, dict], *, smoke: bool, total_s: float) -> dict:
    """Write build/report.html and build/summary.md; return what they say (machine and lessons)."""
    build_dir = Path(build_dir)
    lessons = lesson_entries(build_dir, status)
    context = {"generated": time.strftime("%Y-%m-%d %H:%M:%S"), "smoke": smoke, "total": duration(total_s),
               "command": "lessonkit run --smoke" if smoke else "lessonkit run", "machine": machine_table(),
               "lessons": lessons, "n_ok": sum(e["ok"] for e in lessons)}
    env = _environment()
    (build_dir / "report.html").write_text(env.get_template("report.html.j2").render(context), encoding="utf-8")
    (build_dir / "summary.md").write_text(env.get_template("summary.md.j2").render(context), encoding="utf-8")
    return context
