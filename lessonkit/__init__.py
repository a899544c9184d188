"""lessonkit: a workbook for the lossless acceleration stack of local LLM inference.

The house, bottom up; every import points down (tests/test_layout.py checks it):

  engine/        the disk-streaming MoE engine and what it needs (nothing here imports a technique)
  workloads/     what the lessons run on: corpus, monitoring stream, judges, shipped-model training
  speculative/   \\
  mtp/            |
  grammar/        |  the techniques, one package each; none imports a lesson, benchmark or the CLI
  prefix_cache/   |
  semcache/       |
  gap/           /
  stack.py       the whole stack as one pipeline, and the drafters by name
  lessons/       one module per notebook (the only code that draws), the results recorder, the main job
  bench/         one module per benchmark
  commands.py    what each command does; cli.py: every command in one table

A notebook finds the workbook's data and models through the installed package (`data_dir()`), never
through its working directory, so a notebook copied out of the repository still runs.
"""
from pathlib import Path

__version__ = "0.1.0"

REPO_ROOT = Path(__file__).resolve().parents[1]


def data_dir() -> Path:
    """The workbook's data/ folder (corpus, trained models, Epoch AI data), found beside this package.

    Raises LessonkitError when the package was installed without its repository (a wheel, not `pip install -e`)."""
    d = REPO_ROOT / "data"
    if not (d / "models").is_dir() or not (d / "corpus").is_dir():
        from lessonkit.engine.errors import LessonkitError
        raise LessonkitError(f"lessonkit at {Path(__file__).parent} has no workbook data beside it ({d} lacks "
                             "models/ or corpus/): install it from a clone of the repository with "
                             "`pip install -e .` (./workbook run does)")
    return d
