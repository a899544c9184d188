"""The results folder of a sweep, and nothing is written outside it:

  sweep.json        what the sweep runs (kind, target, grid, fixed values, repeats) and its points' ids
  points/ID.json    one point's row (parameters, figures, status, error, time, machine, kernel path), written
                    atomically by the point itself: a reader sees no row or the whole row, never a torn one
  points/ID/        the point's outputs (its executed notebook, its bench JSON)
  results.csv       the table: every row of the sweep's points, rebuilt from points/ and written atomically

A point is complete when its row parses, names its own id and says ok; a resumed sweep skips those."""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from lessonkit.errors import LessonkitError
from lessonkit.files.atomic import atomic_write
from lessonkit.sweep.grid import Point, Sweep

SPEC = "sweep.json"
TABLE = "results.csv"
FIRST = ["id", "repeat", "status"]
LAST = ["seconds", "error", "host", "cpu", "kernel", "worker", "run", "finished"]


def prepare(folder: str | Path, sweep: Sweep, points: list[Point]) -> Path:
    """Create the folder (or check that it holds this same sweep) and write sweep.json."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise LessonkitError(f"{folder}: not a folder (a sweep writes its results into a folder)")
    spec_file = folder / SPEC
    if spec_file.exists():
        old = read_spec(folder)
        if (old["kind"], old["target"]) != (sweep.kind, sweep.target):
            raise LessonkitError(f"{folder} holds a sweep of {old['kind']}:{old['target']}, not "
                                 f"{sweep.kind}:{sweep.target}; give another results folder")
    elif folder.exists() and any(folder.iterdir()):
        raise LessonkitError(f"{folder}: a folder that is not empty and holds no {SPEC}; give a new or empty folder")
    (folder / "points").mkdir(parents=True, exist_ok=True)
    spec = {**sweep.spec(), "points": [p.id for p in points]}
    atomic_write(spec_file, json.dumps(spec, indent=1).encode("utf-8"))
    return folder


def read_spec(folder: str | Path) -> dict:
    from lessonkit.files.safe_files import load_json_file
    spec = load_json_file(Path(folder) / SPEC, "sweep.json")
    if not isinstance(spec, dict) or not {"kind", "target", "grid", "points"} <= set(spec):
        raise LessonkitError(f"{Path(folder) / SPEC}: not a lessonkit sweep.json")
    return spec


def row_path(folder: Path, pid: str) -> Path:
    return Path(folder) / "points" / f"{pid}.json"


def write_row(folder: Path, row: dict) -> None:
    atomic_write(row_path(folder, row["id"]), json.dumps(row, default=str).encode("utf-8"))


def read_row(folder: Path, pid: str) -> dict | None:
    """The point's row, or None when there is none or it is not a whole row of this point."""
    try:
        row = json.loads(row_path(folder, pid).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(row, dict) or row.get("id") != pid or row.get("status") not in ("ok", "failed"):
        return None
    return row


def complete(folder: Path, pid: str) -> bool:
    row = read_row(folder, pid)
    return row is not None and row["status"] == "ok"


def rows(folder: str | Path) -> list[dict]:
    """The rows of the sweep's points, in sweep.json's order (points without a row are left out)."""
    folder = Path(folder)
    return [r for pid in read_spec(folder)["points"] if (r := read_row(folder, pid)) is not None]


def flat(row: dict) -> dict:
    """One line of the table: id, repeat, status, the parameters, the figures, then where and how it ran."""
    out = {k: row.get(k) for k in FIRST}
    out.update(row.get("params", {}))
    out.update({k if k not in out else f"figure:{k}": v for k, v in row.get("figures", {}).items()})
    out.update({k: row.get(k) for k in LAST})
    return out


def write_table(folder: str | Path) -> Path:
    """results.csv from the rows, atomically (a reader sees the old table or the new one)."""
    lines = [flat(r) for r in rows(folder)]
    columns = list(dict.fromkeys(k for line in lines for k in line)) or FIRST + LAST
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    w.writeheader()
    w.writerows(lines)
    return atomic_write(Path(folder) / TABLE, buf.getvalue().encode("utf-8"))


def read_table(folder: str | Path):
    """The table as a pandas DataFrame (one row per point)."""
    import pandas as pd
    path = Path(folder) / TABLE
    if not path.exists():
        raise LessonkitError(f"{folder}: no {TABLE} (is it a sweep's results folder? run `lessonkit sweep run` first)")
    return pd.read_csv(path)
