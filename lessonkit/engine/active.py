"""The settings in force, changed in one place and described in one place.

`use(**changes)` runs a block with some of the run's settings (engine.settings.RunSettings) changed and every one
restored after, on an exception too: benchmarks, lessons and tests load the same model twice to compare two
kernel paths, numerics or forwards side by side in one process. `adopt(SETTINGS)` takes the settings
`lessonkit run` hands a notebook (engine.settings.parameter) for the rest of the process. `describe()` is what `lessonkit doctor`, every
`--json`, every bench's machine record and the report say about them (lessonkit.engine.machine.machine_record).

This module sits above the ones that act on each setting (engine.kernel, engine.c_plan, engine.packed_layout),
which read theirs from engine.settings: so the settings module itself imports none of them.
"""
from __future__ import annotations

import contextlib
from dataclasses import asdict
from typing import Callable, Iterator, Mapping

from lessonkit.engine import kernel, settings
from lessonkit.engine.c_plan import FORWARD_CHOICES, requested_path
from lessonkit.engine.packed_layout import choose_weights
from lessonkit.errors import LessonkitError

WEIGHT_CHOICES = ("auto", "native", "f32", "q8_0")


def _swapped(check: Callable[[str], None], swap: Callable[[str, str], tuple[str, str]]):
    """A kernel setting (the path: check_backend / swap_backend; the numerics: check_numerics / swap_numerics)
    that weights prepared inside the block take."""
    @contextlib.contextmanager
    def change(name: str, why: str = "chosen for a comparison") -> Iterator[None]:
        check(name)
        old = swap(name, f"{why} ({name})")
        try:
            yield
        finally:
            swap(*old)
    return change


@contextlib.contextmanager
def _threads(n: int, why: str = "") -> Iterator[None]:
    """Products inside split over n kernel threads (the bits do not depend on n)."""
    old = kernel.asked_threads()
    kernel.set_threads(n)                  # checks n
    try:
        yield
    finally:
        kernel.set_threads(old)


def _asked(name: str, choices: tuple[str, ...]) -> Callable[[str], contextlib.AbstractContextManager]:
    """A setting that engine.settings.current() answers (forward, weights): checked here, asked for by `use`."""
    def change(value: str, why: str = "") -> contextlib.AbstractContextManager:
        if value not in choices:
            raise ValueError(f"unknown {name} {value!r}: expected {' or '.join(choices)}")
        return contextlib.nullcontext()
    return change


# In the order they apply (and the reverse of the order they are restored): the path before the numerics,
# whose int8 needs a C kernel path.
CHANGES = {"kernel": _swapped(kernel.check_backend, kernel.swap_backend),
           "numerics": _swapped(kernel.check_numerics, kernel.swap_numerics), "threads": _threads,
           "weights": _asked("weights", WEIGHT_CHOICES), "forward": _asked("forward", FORWARD_CHOICES)}


def _enter(stack: contextlib.ExitStack, changes: dict, why: str) -> None:
    """Every change named (None: left as it is) entered on `stack`, which restores them in the reverse order."""
    unknown = sorted(set(changes) - set(CHANGES))
    if unknown:
        raise ValueError(f"unknown setting {unknown[0]!r}: expected one of {', '.join(CHANGES)}")
    for name, change in CHANGES.items():
        if changes.get(name) is not None:
            stack.enter_context(change(changes[name], why))
            stack.callback(settings.ask, name, settings.ask(name, changes[name]))


@contextlib.contextmanager
def use(why: str = "chosen for a comparison", **changes) -> Iterator[settings.RunSettings]:
    """Models and weights prepared inside the block take the settings named (kernel="avx2", numerics="int8",
    threads=2, weights="f32", forward="torch"; None leaves one as it is); all are restored after, in the reverse
    order, whatever the block raises; `why` is what describe() says chose them. Yields the settings in force
    (engine.settings.current())."""
    with contextlib.ExitStack() as stack:
        _enter(stack, changes, why)
        yield settings.current()


_ADOPTED = contextlib.ExitStack()   # what adopt() took: held for the rest of the process, never closed


def adopt(parameter: Mapping | None) -> settings.RunSettings:
    """A notebook's one call for its SETTINGS parameter (engine.settings.from_parameter: what `lessonkit run`
    hands it, or a researcher's papermill -y 'SETTINGS: {numerics: int8}'): the kernel path, numerics, weights
    and forward asked for ("auto": the process's own choice) and the kernel's threads, torch's from them
    (engine.threads.use_threads), for the rest of the process. None changes nothing. The settings in force."""
    from lessonkit.engine.threads import use_threads
    asked = settings.from_parameter(parameter)
    with contextlib.ExitStack() as stack:       # all checked before any is kept
        _enter(stack, {k: v for k, v in asdict(asked).items() if v != "auto"}, "the run's SETTINGS")
        _ADOPTED.push(stack.pop_all())
    if asked.threads is not None:
        use_threads(asked.threads)
    return settings.current()


def _or_refusal(choose: Callable[[], tuple[str, str]]) -> tuple[str | None, str]:
    """choose()'s (choice, why), or (None, why the setting is refused): a bad LESSONKIT_WEIGHTS or LESSONKIT_FORWARD
    is described, and the command that acts on it says so first."""
    try:
        return choose()
    except LessonkitError as e:
        return None, str(e)


def describe() -> dict:
    """The settings in force and why each was chosen: the kernel's path, instruction set, numerics, binary and
    threads (kernel.backend()), the weights models load and the forward asked for (None and why, when refused),
    with the thread count of commands given no --threads (settings.default())."""
    weights, weights_why = _or_refusal(choose_weights)
    forward, forward_why = _or_refusal(lambda: (requested_path(), "LESSONKIT_FORWARD or use(forward=...)"))
    return {**kernel.backend(), "weights": weights, "weights_why": weights_why, "forward": forward,
            "forward_why": forward_why, "default_threads": settings.default().threads}
