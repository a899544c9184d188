"""A sweep's results, read: `lessonkit sweep report FOLDER` writes FOLDER/report.html (one self-contained page in
the main job's style: the grid, each constant once; each measured figure that varies against the swept
parameters, the point kind's lead figures first, lines for one, a heat map for two; and every point's row),
and `lessonkit compare OLD NEW` on two sweep folders says which figures moved."""
from __future__ import annotations

import time
from pathlib import Path

import jinja2
import numpy as np

from lessonkit.files.atomic import atomic_write
from lessonkit.files.resources import PACKAGE_DIR
from lessonkit.sweep import store
from lessonkit.sweep.points import POINT_KINDS

TEMPLATES = PACKAGE_DIR / "sweep" / "templates"
MAX_FIGURES = 24
META = set(store.FIRST + store.LAST)


def swept(spec: dict) -> list[str]:
    """The parameters that take more than one value, in the grid's order."""
    return [n for n, vs in spec["grid"].items() if len(vs) > 1]


def _declared(spec: dict) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The point kind's (lead figures, figures that restate a parameter): points.POINT_KINDS."""
    kind = POINT_KINDS.get(spec["kind"])
    return (kind.lead, kind.restated) if kind else ((), ())


def figure_columns(df, spec: dict) -> list[str]:
    """The measured figures that are numbers: the point kind's lead figures first (speed-up, tokens per verify,
    ...), then the rest in the table's order; never a parameter, a figure that restates one, or where or how a
    point ran."""
    lead, restated = _declared(spec)
    skip = META | set(spec["grid"]) | set(spec.get("fixed", {})) | set(restated)
    found = [c for c in df.columns if c not in skip and df[c].dtype.kind in "if" and df[c].notna().any()]
    return sorted(found, key=lambda c: lead.index(c) if c in lead else len(lead))


def _said(v) -> str:
    """A value as the page says it: a whole number without its .0, a fraction to six figures."""
    if isinstance(v, (float, np.floating)) and float(v).is_integer():
        return str(int(v))
    return f"{v:.6g}" if isinstance(v, (float, np.floating)) else str(v)


def constants(df, spec: dict) -> tuple[dict[str, str], dict[str, str]]:
    """({parameter: value}, {measured figure: value}) of what is the same in every point: the set parameters,
    those the grid gives one value, figures that restate them, and (with two points complete or more) the
    measured figures that came out the same in each. The grid table says each once; none is drawn."""
    ok, restated = df[df.status == "ok"], _declared(spec)[1]
    params = {**{n: vs[0] for n, vs in spec["grid"].items() if len(vs) == 1}, **spec.get("fixed", {})}
    same = [c for c in ok.columns if len(ok) > 1 and c not in META and ok[c].notna().all() and ok[c].nunique() == 1]
    params.update({c: ok[c].iloc[0] for c in same if c in restated})
    measured = {c: _said(ok[c].iloc[0]) for c in figure_columns(ok, spec) if c in same}
    return {n: _said(v) for n, v in params.items()}, measured


def pictures(df, spec: dict) -> list[dict]:
    """One picture per measured figure that varies, lead figures first, against the swept parameters."""
    from lessonkit.lessons.sweep_plots import plot_sweep, png_base64
    axes = swept(spec)
    ok = df[df.status == "ok"]
    if not axes or ok.empty:
        return []
    same = constants(df, spec)[1]
    drawn = [c for c in figure_columns(ok, spec) if c not in same][:MAX_FIGURES]
    return [{"name": c, "png": png_base64(plot_sweep(ok, axes, c))} for c in drawn]


def _where(df) -> dict[str, str]:
    """The machines, CPUs and kernel paths the points ran on (each distinct value once)."""
    return {label: ", ".join(sorted({str(v) for v in df[col].dropna()})) or "-"
            for label, col in (("hosts", "host"), ("CPUs", "cpu"), ("kernel paths", "kernel"), ("workers", "worker"))
            if col in df}


def _grid(spec: dict, params: dict[str, str], measured: dict[str, str]) -> dict[str, str]:
    """The grid table's rows: what is swept, what is the same in every point (each once), the repeats."""
    rows = {"swept": "; ".join(f"{n} = {', '.join(_said(v) for v in vs)}" for n, vs in spec["grid"].items()
                               if len(vs) > 1) or "nothing",
            "set (every point)": ", ".join(f"{n} = {v}" for n, v in params.items()) or "nothing"}
    if measured:
        rows["measured, the same in every point"] = ", ".join(f"{n} = {v}" for n, v in measured.items())
    return {**rows, "repeats": str(spec.get("repeats", 1))}


def _table_columns(df, spec: dict, said: set[str]) -> list[str]:
    """The columns of every point's row: id, repeat, status and the parameters, the measured figures in the order
    they are drawn, then how long and where; less what the grid table says once."""
    figures = [c for c in figure_columns(df, spec) if c not in said]
    rest = [c for c in df.columns if c not in said and c not in figures]
    last = set(store.LAST)
    return [c for c in rest if c not in last] + figures + [c for c in rest if c in last]


def write_sweep_report(folder: str | Path) -> Path:
    folder = Path(folder)
    spec, df = store.read_spec(folder), store.read_table(folder)
    what = f"{spec['kind']}:{spec['target']}" if spec["target"] else spec["kind"]
    params, measured = constants(df, spec)
    shown = _table_columns(df, spec, set(params) | set(measured) | {"host", "cpu", "kernel", "worker", "run"})
    drawn = pictures(df, spec)
    context = {"generated": time.strftime("%Y-%m-%d %H:%M:%S"), "what": what, "spec": spec, "swept": swept(spec),
               "n": len(spec["points"]), "n_rows": len(df), "n_ok": int((df.status == "ok").sum()),
               "n_failed": int((df.status == "failed").sum()), "where": _where(df), "pictures": drawn,
               "columns": shown, "rows": df[shown].astype(object).where(df[shown].notna(), "").values.tolist(),
               "grid": _grid(spec, params, measured),
               "lead": [p["name"] for p in drawn if p["name"] in _declared(spec)[0]]}
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
