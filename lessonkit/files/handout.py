"""`lessonkit lessons DEST`: the notebooks, exercises and the docs they link, copied where a student works.

The copy keeps the workbook's own layout (DEST/notebooks/..., DEST/docs/...), so a notebook's links to
`../docs/*.md` work in `jupyter lab DEST`. The notebooks find data and models through the installed package,
not through the folder they lie in, so the copy runs wherever it is. A file already in DEST is never
overwritten (it may hold a student's work): it is left as it is and named in the result."""
from __future__ import annotations

import shutil
from pathlib import Path

from lessonkit.files.resources import workbook_path
from lessonkit.errors import LessonkitError

PARTS = {"notebooks": ("*.ipynb", "exercises/*.ipynb"), "docs": ("*.md",)}
SOLUTIONS = ("solutions/*.ipynb",)


def handout_files(solutions: bool = False) -> list[tuple[Path, Path]]:
    """(source, path relative to DEST) for every file a handout holds."""
    out = []
    for part, patterns in PARTS.items():
        src = workbook_path(part)
        if not src.is_dir():
            raise LessonkitError(f"the workbook's {part}/ folder is missing ({src}): reinstall lessonkit")
        for pattern in patterns + (SOLUTIONS if solutions and part == "notebooks" else ()):
            out += [(p, Path(part) / p.relative_to(src)) for p in sorted(src.glob(pattern))]
    return out


def copy_lessons(dest: str | Path, solutions: bool = False) -> dict:
    """Copy the handout into dest; returns {"dest", "copied": [...], "kept": [...]} (kept: already there)."""
    dest = Path(dest)
    if dest.exists() and not dest.is_dir():
        raise LessonkitError(f"{dest} is not a folder")
    copied, kept = [], []
    for src, rel in handout_files(solutions):
        target = dest / rel
        if target.exists() or target.is_symlink():
            kept.append(str(rel))
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".part")
        shutil.copyfile(src, tmp)
        tmp.replace(target)
        copied.append(str(rel))
    return {"dest": str(dest.resolve()), "copied": copied, "kept": kept}
