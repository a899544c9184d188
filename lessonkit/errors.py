"""One exception type for bad input: the CLI prints it as one line and exits with code 2. Running out of memory
or threads is the same: one line naming what ran out and what to change (ResourceError, ran_out_line)."""
from __future__ import annotations

import errno
import re


class LessonkitError(ValueError):
    """Bad input (missing or corrupt file, wrong shape, unknown name, impossible budget).

    The message names the file or value at fault; nothing deeper is shown to the user.
    """


class ResourceError(LessonkitError):
    """The system refused memory or a thread (or will: a limit checked before starting); the message says which,
    the limit and what to change."""


MEMORY_TEXT = ("can't allocate memory", "failed to map segment", "cannot allocate memory", "out of memory", "os error 12", "error code 12")
THREAD_TEXT = ("can't start new thread", "thread creation failed", "pthread_create")
MEMORY_ADVICE = "use a smaller model, a smaller --expert-budget-mb or fewer --threads, or allow more memory"
THREAD_ADVICE = "use fewer --threads or leave out --prefetch, or allow more threads"


def ran_out(e: BaseException | None) -> str | None:
    """'memory' or 'threads' when e (or what it was raised from) is the system refusing memory or a thread: torch's
    allocator, mmap's ENOMEM, MemoryError, a thread or process that cannot start; else None. A LessonkitError's
    own text is not read (it may quote a file's name), only the exception it was raised from."""
    for _ in range(8):
        if e is None:
            return None
        if isinstance(e, ResourceError):
            return "threads" if str(e).startswith("out of threads") else "memory"
        if isinstance(e, MemoryError) or isinstance(e, OSError) and e.errno == errno.ENOMEM:
            return "memory"
        if isinstance(e, OSError) and e.errno == errno.EAGAIN:
            return "threads"
        text = "" if isinstance(e, LessonkitError) else str(e).lower()
        if any(t in text for t in MEMORY_TEXT):
            return "memory"
        if any(t in text for t in THREAD_TEXT):
            return "threads"
        e = e.__cause__ or e.__context__
    return None


def ran_out_line(e: BaseException, what: str | None = None) -> str | None:
    """The one line for an exception that is running out (ran_out), else None: what ran out, the limit that
    bound it where one is set, what to change. what: the thing that could not start (e.g. 'the --prefetch thread')."""
    kind = ran_out(e)
    if kind is None:
        return None
    if isinstance(e, ResourceError):
        return str(e)
    if kind == "memory":
        return f"out of memory ({what or _detail(e)}{limits_text('memory')}): {MEMORY_ADVICE}"
    return f"out of threads ({what or 'the system refused to start a thread'}{limits_text('threads')}): {THREAD_ADVICE}"


def _detail(e: BaseException) -> str:
    text = " ".join(str(x) for x in (e, e.__cause__, e.__context__) if x is not None)
    m = re.search(r"allocate (\d+) bytes", text) or re.search(r"mmap (\d+) bytes", text)
    if m:
        return f"{int(m.group(1)) / 2**20:,.1f} MiB could not be had"
    m = re.search(r"Unable to allocate ([\d.]+ \w+)", text)
    return f"{m.group(1)} could not be had" if m else "an allocation failed"


def limits_text(kind: str) -> str:
    """'; LIMIT' for the limits set on this process that bind it (address space; processes and threads)."""
    try:
        import resource
    except ImportError:          # Windows: no rlimits
        return ""
    parts = []
    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    if soft != resource.RLIM_INFINITY:
        parts.append(f"the address space is limited to {soft / 2**20:,.0f} MB, ulimit -v")
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[0]
    if kind == "threads" and nproc != resource.RLIM_INFINITY:
        parts.append(f"this user may run {nproc:,} processes and threads, ulimit -u")
    return "".join(f"; {p}" for p in parts)
