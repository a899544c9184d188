"""A sweep's results, read: `lessonkit sweep report FOLDER` writes FOLDER/report.html (one self-contained page in
the main job's style: each recorded figure against the swept parameters, lines for one, a heat map for two, and
every point's row), and `lessonkit compare OLD NEW` on two sweep folders says which figures moved."""
from __future__ import annotations

import json
import time
from pathlib import Path

import jinja2

from lessonkit.files.atomic import atomic_write
from lessonkit.files.resources import PACKAGE_DIR
from lessonkit.sweep import store

TEMPLATES = PACKAGE_DIR / "sweep" / "templates"
MAX_FIGURES = 24
META = set(store.FIRST + store.LAST)


def swept(spec: dict) -> list[str]:
    """The parameters that take more than one value, in the grid's order."""
    return [n for n, vs in spec["grid"].items() if len(vs) > 1]


def figure_columns(df, spec: dict) -> list[str]:
    """The recorded figures that are numbers (not a parameter, not where or how a point ran)."""
    params = set(spec["grid"]) | set(spec.get("fixed", {}))
    return [c for c in df.columns if c not in META | params and df[c].dtype.kind in "if" and df[c].notna().any()]


def pictures(df, spec: dict) -> list[dict]:
    from lessonkit.lessons.sweep_plots import plot_sweep, png_base64
    axes = swept(spec)
    ok = df[df.status == "ok"]
    if not axes or ok.empty:
        return []
    return [{"name": c, "png": png_base64(plot_sweep(ok, axes, c))} for c in figure_columns(ok, spec)[:MAX_FIGURES]]


def _where(df) -> dict[str, str]:
    """The machines, CPUs and kernel paths the points ran on (each distinct value once)."""
    return {label: ", ".join(sorted({str(v) for v in df[col].dropna()})) or "-"
            for label, col in (("hosts", "host"), ("CPUs", "cpu"), ("kernel paths", "kernel"), ("workers", "worker"))
            if col in df}


def write_sweep_report(folder: str | Path) -> Path:
    folder = Path(folder)
    spec, df = store.read_spec(folder), store.read_table(folder)
    what = f"{spec['kind']}:{spec['target']}" if spec["target"] else spec["kind"]
    shown = [c for c in df.columns if c not in ("host", "cpu", "kernel", "worker", "run")]
    context = {"generated": time.strftime("%Y-%m-%d %H:%M:%S"), "what": what, "spec": spec, "swept": swept(spec),
               "n": len(spec["points"]), "n_rows": len(df), "n_ok": int((df.status == "ok").sum()),
               "n_failed": int((df.status == "failed").sum()), "where": _where(df), "pictures": pictures(df, spec),
               "columns": shown, "rows": df[shown].astype(object).where(df[shown].notna(), "").values.tolist(),
               "grid_json": json.dumps({"grid": spec["grid"], "set": spec.get("fixed", {}),
                                        "repeats": spec.get("repeats", 1)})}
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=jinja2.select_autoescape(["html"]),
                             trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined)
    html = env.get_template("sweep.html.j2").render(context)
    return atomic_write(folder / "report.html", html.encode("utf-8"))


def _means(folder) -> dict[str, dict]:
    """{point's parameters in words: {figure: mean over its repeats}} of a sweep's complete points."""
    spec, df = store.read_spec(folder), store.read_table(folder)
    params = list(spec["grid"]) + list(spec.get("fixed", {}))
    ok = df[df.status == "ok"]
    figures = figure_columns(ok, spec)
    out = {}
    for key, g in ok.groupby(params, sort=True, dropna=False) if params else [((), ok)]:
        key = key if isinstance(key, tuple) else (key,)
        out[", ".join(f"{p}={v}" for p, v in zip(params, key)) or "(no parameters)"] = \
            {f: float(g[f].mean()) for f in figures if g[f].notna().any()}
    return out


def compare_sweeps(old: str | Path, new: str | Path, rel_noise: float = 0.1) -> int:
    """Print each point's figures that moved by more than rel_noise between two sweeps (points matched by their
    parameters, repeats averaged) and the points only one sweep has; exit 1 if any moved."""
    from lessonkit.report.runner import figure_moved
    a, b = _means(old), _means(new)
    moved = 0
    for point in sorted(set(a) | set(b)):
        if point not in a or point not in b:
            print(f"{point}: only in {'the new' if point in b else 'the old'} sweep")
            continue
        for f in sorted(set(a[point]) | set(b[point])):
            change = figure_moved(a[point].get(f), b[point].get(f), rel_noise)
            if change is not None:
                moved += 1
                print(f"{point}: {f}: {change}")
    print(f"{moved} figure(s) moved beyond {rel_noise:.0%}" if moved else f"nothing moved beyond {rel_noise:.0%}")
    return 1 if moved else 0
