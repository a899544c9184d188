"""What the workbook keeps in its cache folder (lessonkit_home()), by kind, and clearing a kind (`lessonkit cache`).

A student's laptop fills up: converted models, training caches and llama.cpp builds reach gigabytes. Everything in
the cache folder can be made again, at a price: KINDS names each kind of entry, what it holds and what makes it
again, and `lessonkit cache` lists their sizes. `--clear KIND ...` says what it would remove; with `--yes` it removes.

Safety, in the order the code checks it:
  - only entries directly in the cache folder that a kind of KINDS names are ever removed; any other entry is listed
    as unknown and never touched, whatever is asked;
  - a symlink is never followed (it counts 0 bytes) and never removed: it may point anywhere;
  - an entry is first renamed within the folder (PARTIAL + its name: one atomic step), then deleted, so a clear that
    fails half-way (a file held open on Windows, a permission) leaves a PARTIAL entry no loader reads, never a
    half-deleted model a loader would take for a whole one; the next clear of that kind removes what is left.
"""
from __future__ import annotations

import fnmatch
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from lessonkit.errors import LessonkitError
from lessonkit.files.resources import lessonkit_home

PARTIAL = ".clearing-"          # an entry being removed: renamed to PARTIAL + its name first


@dataclass(frozen=True)
class Kind:
    pattern: str                # the entry's name directly in the cache folder (a glob)
    holds: str
    again: str                  # what makes it again, and what clearing it costs


KINDS = {
    "models": Kind("models", "converted and merged model weights (smollm2-135m's blocks, the adapters merged in)",
                   "made again at the model's next load (seconds to minutes)"),
    "converted": Kind("converted", "checkpoints converted from another layout",
                      "made again at the model's next load"),
    "hf-export": Kind("hf-export", "models exported to Hugging Face's format for the reference checks",
                      "made again by the lesson or benchmark that needs one"),
    "feature-head": Kind("feature-head", "`train-head`'s target passes (the target's features on its training data)",
                         "recomputed by the next `train-head` (minutes)"),
    "distill": Kind("distill", "`train`'s distillation targets", "recomputed by the next `train` that needs them"),
    "mtp-states": Kind("mtp_states", "the target states `mtp-doctor` evaluates on",
                       "recomputed by the next `mtp-doctor`"),
    "llamacpp": Kind("llamacpp-*", "llama.cpp builds for `bench llamacpp`",
                     "`bench llamacpp --build` builds one again (minutes, from PyPI)"),
    "suffix": Kind("suffix", "the suffix drafter's stores of the target's earlier outputs (--draft suffix, auto)",
                   "learnt again from later runs: what the stores learnt is lost"),
    "memo": Kind("verified.json", "the memo of model files already checked against their SHA-256",
                 "files checked again at their next load"),
}


def kind_of(name: str) -> str | None:
    """The kind an entry of the cache folder is (an entry being cleared counts as its kind), or None."""
    base = name[len(PARTIAL):] if name.startswith(PARTIAL) else name
    return next((k for k, kind in KINDS.items() if fnmatch.fnmatchcase(base, kind.pattern)), None)


def _bytes(path: str | Path) -> int:
    """A file's size, 0 for a symlink or a file gone since it was listed (another process clearing or writing)."""
    try:
        st = os.lstat(path)
    except OSError:
        return 0
    return 0 if stat.S_ISLNK(st.st_mode) else st.st_size


def _size(path: Path) -> tuple[int, int]:
    """(bytes, files) under path, never following a symlink (one counts 0 bytes)."""
    if path.is_symlink() or not path.is_dir():
        return _bytes(path), 1
    total = files = 0
    for root, dirs, names in os.walk(path):         # os.walk does not descend into symlinked folders
        total += sum(_bytes(os.path.join(root, n)) for n in names)
        files += len(names)
    return total, files


def entries(home: Path | None = None) -> list[dict]:
    """Every entry directly in the cache folder: name, kind (None: unknown), bytes, files, symlink."""
    home = Path(home or lessonkit_home())
    if not home.is_dir():
        return []
    out = []
    for p in sorted(home.iterdir()):
        size, files = _size(p)
        out.append({"name": p.name, "kind": kind_of(p.name), "bytes": size, "files": files,
                    "symlink": p.is_symlink()})
    return out


def check_kinds(names: list[str]) -> list[str]:
    """The kinds asked for ("all": every kind), each checked: an unknown one is one error naming the known ones."""
    bad = [n for n in names if n != "all" and n not in KINDS]
    if bad:
        raise LessonkitError(f"cache kind {bad[0]!r}: expected all or one of {', '.join(KINDS)}")
    return list(KINDS) if "all" in names else list(dict.fromkeys(names))


def clear(kinds: list[str], *, yes: bool, home: Path | None = None) -> list[dict]:
    """Remove the entries of `kinds` (with yes; without it, only say what would go): [{name, kind, bytes, done}].
    done: "removed", "would remove", or why an entry was kept."""
    home = Path(home or lessonkit_home())
    wanted, out = check_kinds(kinds), []
    for e in entries(home):
        if e["kind"] not in wanted:
            continue
        row = {k: e[k] for k in ("name", "kind", "bytes")}
        if e["symlink"]:
            row["done"] = "kept: a symlink (never followed, never removed)"
        elif not yes:
            row["done"] = "would remove"
        else:
            row["done"] = _remove(home, e["name"])
        out.append(row)
    return out


def _remove(home: Path, name: str) -> str:
    """Rename the entry aside within the folder, then delete it; an error is one line naming the entry."""
    path = home / name
    aside = path if name.startswith(PARTIAL) else home / f"{PARTIAL}{name}"
    try:
        if aside != path:
            os.replace(path, aside)
        shutil.rmtree(aside) if aside.is_dir() else aside.unlink()
    except OSError as e:
        raise LessonkitError(f"{aside}: could not be removed ({e.strerror or e}); what is left is named "
                             f"{PARTIAL}..., never read, and goes with the next clear of {kind_of(name)}") from e
    return "removed"


def human(n: float) -> str:
    """Bytes in the largest unit that keeps a number >= 1 (B, KB, MB, GB; powers of 1024)."""
    for unit in ("B", "KB", "MB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def report_lines(rows: list[dict], home: Path) -> list[str]:
    """The listing as text: one line per entry, the total, and how to clear."""
    lines = [f"cache folder: {home} (LESSONKIT_HOME overrides it)"]
    if not rows:
        return lines + ["  (empty)"]
    for r in rows:
        what = (f"{r['kind']}: {KINDS[r['kind']].holds}; {KINDS[r['kind']].again}" if r["kind"]
                else "unknown to lessonkit: never touched")
        lines.append(f"  {human(r['bytes']):>9}  {r['name'] + ('@' if r['symlink'] else ''):<28} {what}")
    lines.append(f"  {human(sum(r['bytes'] for r in rows)):>9}  in all; `lessonkit cache --clear KIND ... --yes` "
                 "removes a kind (all: every kind)")
    return lines


def text(rows: list[dict], cleared: list[str] | None, yes: bool) -> str:
    """`lessonkit cache` as text: the listing, or what a clear did (or would do), one line an entry."""
    if not cleared:
        return "\n".join(report_lines(rows, lessonkit_home()))
    if not rows:
        return "nothing of those kinds in the cache folder"
    lines = [f"  {r['done']}: {r['name']} ({human(r['bytes'])})" for r in rows]
    return "\n".join(lines + ([] if yes else ["nothing removed: add --yes to remove them"]))
