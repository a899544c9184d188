"""Bad input, again (issue 53 part 5): every numeric option of every command in the CLI table (threads, k,
budgets, sizes, repeats, seeds, ...) tried at 0, negative, huge and non-numeric values. Each value is either in
the option's stated range or one argparse error naming the option (exit 2, no traceback); parsing runs no
handler, so nothing is written. The cases come from the table itself: a new option cannot skip them."""
from __future__ import annotations

import pytest

from lessonkit.cli import COMMANDS, build_parser, number, thread_counts
from lessonkit.speculative.depth import parse_draft_depth

NUMERIC_TYPES = (number,)
NUMERIC_PARSERS = (thread_counts, parse_draft_depth)
VALUES = ["0", "-1", "-1e30", "1" + "0" * 40, "1e400", "nan", "inf", "abc", "", "1.5.2"]


def commands(table=COMMANDS, path=()):
    """(command words, its argument specs) for every leaf command of the table."""
    for name, entry in table.items():
        if isinstance(entry[1], dict):
            yield from commands(entry[1], path + (name,))
        else:
            yield path + (name,), entry[2]


def flat(specs):
    for a in specs:
        yield from (a[1] if a[0] == "one of" else [a])


def minimal_argv(words, specs) -> list[str]:
    """The command with every required argument filled in (a choice's first value, else 'x')."""
    argv = list(words)
    for a in specs:
        if a[0] == "one of" and a[2]:
            argv += [a[1][0][0][0], "x"]
    for flags, kw in (a for a in specs if a[0] != "one of"):
        value = str(kw["choices"][0]) if "choices" in kw else "x"
        if not flags[0].startswith("-"):
            argv += [value]
        elif kw.get("required"):
            argv += [flags[0], value]
    return argv


def is_numeric(kw) -> bool:
    t = kw.get("type")
    return isinstance(t, NUMERIC_TYPES) or t in NUMERIC_PARSERS


CASES = [(words, specs, flags[0]) for words, specs in commands() for flags, kw in flat(specs)
         if flags[0].startswith("--") and is_numeric(kw)]


def test_every_option_that_takes_a_number_is_checked_by_a_numeric_type():
    """An option with a numeric default, or a name that says it counts, has one of the numeric types."""
    counting = ("thread", "-k", "budget", "size", "repeats", "seed", "steps", "limit", "boot", "windows", "items",
                "check", "workers", "tokens", "first", "rate", "noise", "threshold", "temperature", "top-p")
    for words, specs in commands():
        for flags, kw in flat(specs):
            numeric_default = isinstance(kw.get("default"), (int, float)) and not isinstance(kw.get("default"), bool)
            if flags[0].startswith("--") and kw.get("action") is None and (
                    numeric_default or any(c in flags[0] for c in counting)):
                assert is_numeric(kw), f"lessonkit {' '.join(words)} {flags[0]}: no numeric type"
    assert len(CASES) >= 25, len(CASES)


def test_every_numeric_type_has_an_upper_bound():
    for words, specs, option in CASES:
        kw = next(kw for flags, kw in flat(specs) if flags[0] == option)
        if isinstance(kw["type"], number):
            assert kw["type"].hi < 10**19, f"lessonkit {' '.join(words)} {option}: no upper bound"


@pytest.mark.parametrize("words,specs,option", CASES, ids=[f"{' '.join(c[0])} {c[2]}" for c in CASES])
def test_a_bad_number_is_one_clear_error_naming_the_option(words, specs, option, capsys):
    parser = build_parser()
    base = minimal_argv(words, specs)
    parser.parse_args(base)                                         # the command line without the option parses
    dest = option.lstrip("-").replace("-", "_")
    for value in VALUES:
        try:
            got = getattr(parser.parse_args(base + [f"{option}={value}"]), dest)
        except SystemExit as e:
            err = capsys.readouterr().err
            lines = [line for line in err.splitlines() if "error:" in line]
            assert e.code == 2 and len(lines) == 1 and option in lines[0], (value, err)
            assert "Traceback" not in err and value[:20] in lines[0], (value, err)
            continue
        # accepted: only a small in-range value, parsed to that number (0 where the option allows 0, ...)
        assert value in ("0", "-1") and got in (int(value), float(value), [int(value)]), (option, value, got)
