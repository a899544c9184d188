"""Headline figures of each lesson: recorded by the notebook's last cell, gathered by `lessonkit run`."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pandas as pd


def _plain(v):
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def record_results(lesson: str, figures: dict):
    """Write figures to $LESSONKIT_BUILD/results/<lesson>.json (when set) and return them as a table."""
    clean = {k: _plain(v) for k, v in figures.items()}
    build = os.environ.get("LESSONKIT_BUILD")
    if build:
        out = Path(build) / "results"
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{lesson}.json").write_text(json.dumps({"lesson": lesson, "figures": clean}, indent=2, default=str))
    return pd.DataFrame({"figure": list(clean), "value": list(clean.values())}).set_index("figure")
