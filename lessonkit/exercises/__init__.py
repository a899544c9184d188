"""Self-checks for the exercise notebooks (notebooks/exercises/NN_x.ipynb).

One module per lesson, `<lesson>_checks`, with one public check per exercise:

    from lessonkit.exercises import gap_checks as check
    check.running_max(my_running_max)

The conventions every check follows:

* It runs the student's function on fixed cases (each naming a situation that a plausible mistake
  gets wrong) and seeded random ones, so a run is reproducible.
* It prints exactly one plain line, "<check>: ...": what is wrong on the first failing case, or
  that it passed (e.g. "passed all N cases"), and returns True or False. It never prints the expected
  answer, only what the student's function returned and why that is wrong.
* A stub that raises NotImplementedError gets "<check>: not implemented yet".
* No check raises: an exception from the student's function is reported in that one line, with the
  student's own line where it was raised ("line 3 of your cell: ..."), not the checker's traceback.
* The student's function gets a deep copy of each case's arguments, so it cannot change a case the
  judge then reads (objects of the types given as `shared`, e.g. one torch.Generator that a whole
  check draws from, are passed as they are).

Most checks are a list of `(label, args)` cases and a judge, run by `run_cases`: the judge gets the
original args and what the function returned, and gives None (right) or a sentence saying what is
wrong. A judge that must call the student's function again (say, on a prefix of the case) takes it
as a third argument; run_cases then reports what that call raises as the function's own exception.
A lesson may word the exception line its own way (`on_raise`). Checks that test properties rather
than a list of cases (prefix_checks, spec_checks.rejection_sample) call the function through `call`.

Imports: the lessons (what an exercise shares with its lesson) and everything below them; never the report,
a benchmark or the CLI.
"""
from __future__ import annotations

import copy
import os
import re
import sysconfig
import traceback

from lessonkit.files.resources import PACKAGE_DIR

NOT_IMPLEMENTED = "not implemented yet"
RAISED_ON_CASE = "{name}: on case '{label}' {error}"    # how run_cases reports an exception by default


_NOT_THE_STUDENTS = tuple({str(PACKAGE_DIR), *(
    os.path.realpath(sysconfig.get_paths()[k]) for k in ("stdlib", "platstdlib", "purelib", "platlib"))})
_NOTEBOOK_CELL = re.compile(r"ipykernel_\d+[/\\]\d+\.py$|^<ipython-input-")


def students_line(e: BaseException) -> str:
    """Where in the student's code `e` was raised: the last traceback frame outside lessonkit, the
    standard library and installed packages, as "line N of your cell: <code>" ("" when there is none)."""
    for f in reversed(traceback.extract_tb(e.__traceback__)):
        if os.path.realpath(f.filename).startswith(_NOT_THE_STUDENTS):
            continue
        where = "your cell" if _NOTEBOOK_CELL.search(f.filename) else os.path.basename(f.filename)
        return f"line {f.lineno} of {where}" + (f": {f.line.strip()}" if f.line else "")
    return ""


def raised(e: BaseException) -> str:
    """How the one line reports an exception from the student's function: type, message and the
    student's own line (not the checker's traceback)."""
    line = students_line(e)
    return f"your function raised {type(e).__name__}: {e}" + (f" ({line})" if line else "")


def fresh_args(args, shared: tuple = ()):
    """A deep copy of `args` (a tuple or list of arguments); the arguments that are instances of the
    `shared` types are kept as they are."""
    memo = {id(a): a for a in args if shared and isinstance(a, shared)}
    return copy.deepcopy(args, memo)


def call(fn, args, shared: tuple = ()):
    """Run fn(*fresh copy of args): (result, None), or (None, NOT_IMPLEMENTED) for a stub, or
    (None, "your function raised <type>: <message>"). Never raises (short of KeyboardInterrupt)."""
    try:
        return fn(*fresh_args(args, shared)), None
    except NotImplementedError:
        return None, NOT_IMPLEMENTED
    except Exception as e:  # the student's bug, reported, never raised
        return None, raised(e)


def number(got) -> float | None:
    """What a check that wants one number makes of the student's answer: a float, or None when it is not one."""
    try:
        return float(got)
    except (TypeError, ValueError):
        return None


def run_cases(name: str, fn, cases, judge, *, judge_gets_fn: bool = False, shared: tuple = (),
              on_raise: str = RAISED_ON_CASE) -> bool:
    """Run the check `name`: fn on each `(label, args)` case in turn, judged by judge(args, got)
    (judge(args, got, fn) with judge_gets_fn), until the first problem. Prints one line and returns
    whether every case passed. `on_raise` formats the line for an exception (fields name, label, error)."""
    for label, args in cases:
        got, error = call(fn, args, shared)
        if error is None:
            if judge_gets_fn:
                try:
                    problem = judge(args, got, fn)
                except NotImplementedError:
                    error = NOT_IMPLEMENTED
                except Exception as e:  # raised while the judge re-ran the student's function
                    error = raised(e)
            else:
                problem = judge(args, got)
        if error == NOT_IMPLEMENTED:
            print(f"{name}: {NOT_IMPLEMENTED}")
            return False
        if error:
            print(on_raise.format(name=name, label=label, error=error))
            return False
        if problem:
            print(f"{name}: on case '{label}': {problem}")
            return False
    print(f"{name}: passed all {len(cases)} cases")
    return True
