"""lessonkit: a workbook for the lossless acceleration stack of local LLM inference.

The house, bottom up; every import points down (tests/test_layout.py checks it, docs/architecture.md draws it):

  errors.py      LessonkitError, the one exception for bad input
  files/         the one resolver of the workbook's files, crash-safe writes, safe reads, portable I/O
  engine/        the forward, KV cache, expert store, kernel binding, the on-disk layout, threads
  models/        named models, conversion (GGUF, safetensors), integrity manifests, export, adapters
  workloads/     the request streams and texts the lessons serve (corpus, monitoring, triage, grounded)
  speculative/   \\
  mtp/            |
  grammar/        |  the techniques, one package each; none imports a trainer, lesson, benchmark or the CLI
  prefix_cache/   |
  semcache/       |
  gap/           /   (the Epoch AI gap analysis)
  training/      every trainer: tiny models, distilled and cut drafters, MTP heads, the judge, LoRA, model cards
  stack.py       the whole stack as one pipeline, and the drafters by name
  measure/       experiments and instruments that return data (no plotting): what lessons and benchmarks share
  lessons/       one module per notebook: panels, plots, headline sentences (the only code that draws)
  exercises/     the checks of each lesson's exercises
  report/        the main job (every notebook executed headlessly) and its HTML report
  bench/         one module per benchmark
  commands.py    what each command does; cli.py: every command in one table

A notebook finds the workbook's data and models through the installed package (`data_dir()`, `workbook_path()`),
never through its working directory, so a notebook copied out of the repository, or installed from the wheel, runs.
"""
from lessonkit.files.resources import (PACKAGE_DIR, data_dir, installed_from_wheel, workbook_path,
                                       workbook_root)

__version__ = "0.1.0"
__all__ = ["PACKAGE_DIR", "data_dir", "installed_from_wheel", "workbook_path", "workbook_root", "__version__"]
