"""The one resolver for the workbook's own files: data (models, corpus, Epoch AI data), notebooks, docs, the
schemas lesson 03 uses. Installed from a wheel they lie in the package (lessonkit/workbook/, found with
importlib.resources); in a clone they lie beside it. User-writable state (converted models, caches) is elsewhere:
lessonkit_home() below. No other module finds these files through its own `__file__`."""
from __future__ import annotations

import os
from importlib.resources import files
from pathlib import Path

import platformdirs

from lessonkit.errors import LessonkitError

PACKAGE_DIR = Path(str(files("lessonkit"))).resolve()
SHIPPED = "workbook"        # the wheel's copy of the workbook's files: lessonkit/workbook/{data,notebooks,docs,...}
# what a wheel carries besides the code, as paths relative to the workbook root (setup.py copies them)
WORKBOOK_PARTS = ("data", "notebooks", "docs", "tests/schemas")


def workbook_root() -> Path:
    """The folder that holds the workbook's own files (data/, notebooks/, docs/, tests/schemas/), wherever
    lessonkit is: installed from a wheel, the package's own `workbook/` folder (found with importlib.resources);
    in a clone (`pip install -e .`), the repository beside the package. The one resolver: no other module finds
    the workbook's files through its own `__file__`."""
    shipped = PACKAGE_DIR / SHIPPED
    if (shipped / "data").is_dir():
        return shipped
    return PACKAGE_DIR.parent


def workbook_path(*parts: str) -> Path:
    """A path inside the workbook root: workbook_path("data", "epoch"), workbook_path("notebooks")."""
    return workbook_root().joinpath(*parts)


def installed_from_wheel() -> bool:
    """True when the workbook's files come from the wheel (read-only in spirit: user state goes to
    lessonkit_home()), False in a clone."""
    return workbook_root() != PACKAGE_DIR.parent


def data_dir() -> Path:
    """The workbook's data/ folder (corpus, trained models, Epoch AI data, semantic-cache stream).

    Raises LessonkitError when neither a wheel's copy nor a clone's data/ is there (a broken install)."""
    d = workbook_path("data")
    if not (d / "models").is_dir() or not (d / "corpus").is_dir():
        raise LessonkitError(f"lessonkit at {PACKAGE_DIR} has no workbook data ({d} lacks models/ or corpus/): "
                             "reinstall the wheel, or run from a clone with `pip install -e .`")
    return d


def lessonkit_home() -> Path:
    """The per-user cache folder: hash memo, converted and merged models, teacher passes. LESSONKIT_HOME when
    set, else platformdirs' user cache folder (~/.cache/lessonkit on Linux, ~/Library/Caches/lessonkit on
    macOS, %LOCALAPPDATA%\\lessonkit\\Cache on Windows). Defined here, the lowest module that needs it; the
    registry re-exports it."""
    home = os.environ.get("LESSONKIT_HOME")
    return Path(home) if home else Path(platformdirs.user_cache_dir("lessonkit", appauthor=False))
