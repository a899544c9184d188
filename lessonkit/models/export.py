"""`lessonkit export SRC OUT` without losing anything (issue 35).

* OUT is the source directory itself (or the same directory by another path): refused, always (the
  export would overwrite the model while reading it).
* OUT is a file, or lies under a file: refused.
* OUT already holds a file the export writes (config.json, model.safetensors, tokenizer.json,
  tokenizer_config.json): refused unless force; other files in OUT are never touched.
* The files are written into a temporary directory (inside OUT when it exists, so each rename stays on
  its file system; beside it otherwise) and renamed into place, so OUT never holds a half-written
  file. A read-only or immutable OUT, a full disk or any other write error is one LessonkitError
  naming OUT; the temporary directory is removed and OUT is as it was.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from safetensors import SafetensorError

from lessonkit.files.atomic import publish_dir, replace
from lessonkit.models.convert import export_hf
from lessonkit.errors import LessonkitError
from lessonkit.models.integrity import refuse_special_files

EXPORT_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def check_target(src: Path, out: Path, force: bool) -> None:
    """One LessonkitError when exporting src into out could destroy something."""
    with_src = out.exists() and src.exists() and os.path.samefile(src, out)
    if with_src:
        raise LessonkitError(f"{out}: is the model directory being exported; choose another output directory")
    if out.exists() and not out.is_dir():
        raise LessonkitError(f"{out}: is a file, not a directory")
    above = next((p for p in out.parents if p.exists() or p.is_symlink()), None)
    if not out.exists() and above is not None and not above.is_dir():
        raise LessonkitError(f"{out}: cannot be created, {above} is a file")
    if out.is_dir() and not force:
        clash = [n for n in EXPORT_FILES if (out / n).exists() or (out / n).is_symlink()]
        if clash:
            raise LessonkitError(f"{out}: already holds {', '.join(clash)}; use --force to replace "
                                 f"{'it' if len(clash) == 1 else 'them'}")


def _into_existing(src: Path, out: Path) -> None:
    tmp = Path(tempfile.mkdtemp(dir=out, prefix=".export-"))
    try:
        export_hf(src, tmp)
        for f in sorted(tmp.iterdir()):
            replace(f, out / f.name)      # over a symlink: the link is replaced, its target untouched
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def export_model(src: str | Path, out: str | Path, *, force: bool = False) -> Path:
    """Export the streaming-layout model in src to Hugging Face files in out (see the module docstring)."""
    src, out = Path(src), Path(out)
    refuse_special_files(src)
    check_target(src, out, force)
    try:
        if out.is_dir():
            _into_existing(src, out)
        else:
            with publish_dir(out, prefix=".export-") as tmp:
                export_hf(src, tmp)
            if not out.is_dir():
                raise LessonkitError(f"{out}: the export could not be moved into place")
    except (OSError, SafetensorError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise LessonkitError(f"cannot export to {out}: {why}; nothing was changed there") from None
    return out
