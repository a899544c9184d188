"""The grid of a sweep: names and values, given as `--grid k=1,2,4` and `--set name=value` on the command line
or as a YAML/JSON file ({"grid": {name: [values]}, "set": {name: value}, "repeats": n}), checked against the
point's declared parameters before anything runs, then expanded into points with stable ids.

A point's id is a hash of what it runs (kind, target, parameters, repeat): the same point in a later run of
the sweep has the same id, which is how a resumed sweep knows what is done."""
from __future__ import annotations

import hashlib
import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from lessonkit.errors import LessonkitError

ANY = "any"                                    # a lesson parameter whose default is None: any scalar
TYPES = {bool: "true or false", int: "an integer", float: "a number", str: "text", ANY: "a scalar"}


@dataclass(frozen=True)
class Param:
    """One parameter a point takes: its type (bool, int, float, str or ANY), default and what it means."""
    type: object
    default: object = None
    help: str = ""


@dataclass
class Sweep:
    """What to run (kind and target, see points.POINT_KINDS) over which grid, with which fixed values."""
    kind: str
    target: str | None
    grid: dict[str, list] = field(default_factory=dict)
    fixed: dict[str, object] = field(default_factory=dict)
    repeats: int = 1

    def spec(self) -> dict:
        return {"kind": self.kind, "target": self.target, "grid": self.grid, "fixed": self.fixed,
                "repeats": self.repeats}


@dataclass(frozen=True)
class Point:
    id: str
    params: dict
    repeat: int


def parse_value(text: str, p: Param, name: str):
    """Command-line text as a value of p's type; one error naming the parameter and the value."""
    t = text.strip()
    try:
        if p.type is bool:
            low = t.lower()
            if low not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError
            return low in ("true", "1", "yes")
        if p.type is int:
            return int(t)
        if p.type is float:
            v = float(t)
            if not math.isfinite(v):
                raise ValueError
            return v
        if p.type is ANY:
            return _any_scalar(t)
    except ValueError:
        raise LessonkitError(f"parameter {name!r}: {text!r} is not {TYPES[p.type]}") from None
    if not t:
        raise LessonkitError(f"parameter {name!r}: an empty value")
    return t


def _any_scalar(t: str):
    for cast in (int, float):
        try:
            return cast(t)
        except ValueError:
            pass
    return {"true": True, "false": False, "none": None}.get(t.lower(), t)


def check_value(v, p: Param, name: str):
    """A value from a grid file (typed already): of p's type (an int is a float too, a bool is no number)."""
    if isinstance(v, str) and p.type is not str:
        return parse_value(v, p, name)
    ok = {bool: lambda: isinstance(v, bool),
          int: lambda: isinstance(v, int) and not isinstance(v, bool),
          float: lambda: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
          str: lambda: isinstance(v, str) and v != "",
          ANY: lambda: v is None or isinstance(v, (bool, int, float, str))}[p.type]
    if not ok():
        raise LessonkitError(f"parameter {name!r}: {v!r} is not {TYPES[p.type]}")
    return float(v) if p.type is float else v


def split_assignment(text: str, option: str) -> tuple[str, str]:
    name, eq, values = text.partition("=")
    if not eq or not name.strip():
        raise LessonkitError(f"{option} {text!r}: write NAME=VALUE{'S' if option == '--grid' else ''}")
    return name.strip(), values


def grid_from_args(grid_args: list[str], set_args: list[str]) -> tuple[dict[str, list[str]], dict[str, str]]:
    """`--grid k=1,2,4` and `--set name=value` as {name: [texts]} and {name: text} (checked later)."""
    grid, fixed = {}, {}
    for g in grid_args or []:
        name, values = split_assignment(g, "--grid")
        grid[name] = [v for v in values.split(",")] if values.strip() else []
    for s in set_args or []:
        name, value = split_assignment(s, "--set")
        fixed[name] = value
    return grid, fixed


def load_grid_file(path: str | Path) -> dict:
    """{"grid": {...}, "set": {...}, "repeats": n} from a .yaml/.yml or .json file."""
    import yaml

    from lessonkit.files.safe_files import load_json_file, require_regular
    p = Path(path)
    if p.suffix.lower() == ".json":
        data = load_json_file(p, "sweep grid file")
    else:
        try:
            data = yaml.safe_load(require_regular(p).read_text(encoding="utf-8"))
        except (yaml.YAMLError, UnicodeDecodeError) as e:
            raise LessonkitError(f"{p}: not a YAML grid file ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict) or not isinstance(data.get("grid", {}), dict) \
            or not isinstance(data.get("set", {}), dict):
        raise LessonkitError(f"{p}: a grid file is an object with 'grid' ({{name: [values]}}) and optionally "
                             "'set' ({name: value}) and 'repeats'")
    unknown = set(data) - {"grid", "set", "repeats"}
    if unknown:
        raise LessonkitError(f"{p}: unknown key(s) {sorted(unknown)} (a grid file has grid, set, repeats)")
    return data


def checked(sweep: Sweep, params: dict[str, Param], what: str) -> Sweep:
    """The sweep with every value of its declared type; one error naming the first bad parameter."""
    grid, fixed = {}, {}
    for name, values in sweep.grid.items():
        _known(name, params, what)
        if not isinstance(values, list) or not values:
            raise LessonkitError(f"parameter {name!r}: an empty value list (give at least one value)")
        grid[name] = [check_value(v, params[name], name) for v in values]
        if len(set(map(repr, grid[name]))) < len(grid[name]):
            raise LessonkitError(f"parameter {name!r}: a value is listed twice ({values})")
    for name, v in sweep.fixed.items():
        _known(name, params, what)
        if name in grid:
            raise LessonkitError(f"parameter {name!r} is both swept (--grid) and set (--set)")
        fixed[name] = check_value(v, params[name], name)
    if not isinstance(sweep.repeats, int) or isinstance(sweep.repeats, bool) or sweep.repeats < 1:
        raise LessonkitError(f"repeats: {sweep.repeats!r} is not an integer of at least 1")
    return Sweep(sweep.kind, sweep.target, grid, fixed, sweep.repeats)


def _known(name: str, params: dict[str, Param], what: str) -> None:
    if name not in params:
        raise LessonkitError(f"unknown parameter {name!r} for {what} (it takes: {', '.join(sorted(params)) or 'none'})")


def point_id(kind: str, target: str | None, params: dict, repeat: int) -> str:
    key = json.dumps([kind, target, sorted(params.items()), repeat], default=str)
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]


def expand(sweep: Sweep) -> list[Point]:
    """Every point of the grid (its cross product) times the repeats, the fixed values in each."""
    names = list(sweep.grid)
    points = []
    for values in itertools.product(*(sweep.grid[n] for n in names)):
        params = {**sweep.fixed, **dict(zip(names, values))}
        for r in range(sweep.repeats):
            points.append(Point(point_id(sweep.kind, sweep.target, params, r), params, r))
    return points
