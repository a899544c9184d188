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

A notebook finds the workbook's data and models through the installed package (`data_dir()`, `workbook_path()`),
never through its working directory, so a notebook copied out of the repository, or installed from the wheel, runs.
"""
from lessonkit.engine.resources import (PACKAGE_DIR, data_dir, installed_from_wheel, workbook_path,
                                       workbook_root)

__version__ = "0.1.0"
__all__ = ["PACKAGE_DIR", "data_dir", "installed_from_wheel", "workbook_path", "workbook_root", "__version__"]
