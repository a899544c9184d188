"""Bad numbers and option combinations on the command line get one clear error naming the option and
exit code 2, before any model is loaded: never a traceback, never a silent fallback (issue 21, item 4)."""
import pytest

from lessonkit.cli import main

GEN = ["generate", "--model", "tiny-moe", "--prompt", "hi", "--max-new-tokens", "2"]

CASES = [
    (GEN + ["--temperature", "nan"], "--temperature", "finite"),
    (GEN + ["--temperature", "1e-45"], "--temperature", "at least 0.01"),
    (GEN + ["--temperature", "inf"], "--temperature", "finite"),
    (GEN + ["--temperature", "-1"], "--temperature", "at least 0"),
    (GEN + ["--top-p", "0"], "--top-p", "greater than 0"),
    (GEN + ["--top-p", "1.5"], "--top-p", "at most 1"),
    (GEN + ["--expert-budget-mb", "nan"], "--expert-budget-mb", "finite"),
    (GEN + ["--expert-budget-mb", "inf"], "--expert-budget-mb", "finite"),
    (GEN + ["--expert-budget-mb", "0"], "--expert-budget-mb", "greater than 0"),
    (GEN + ["--stop", ""], "--stop", "empty stop string"),
    (GEN + ["--max-new-tokens", "-3"], "--max-new-tokens", "at least 0"),
    (["semcache", "run", "--limit", "-5"], "--limit", "at least 1"),
    (["semcache", "run", "--threshold", "nan"], "--threshold", "finite"),
    (["semcache", "run", "--audit-rate", "2"], "--audit-rate", "at most 1"),
    (["bench", "engine", "--repeats", "0"], "--repeats", "at least 1"),
]


@pytest.mark.parametrize("argv,option,message", CASES, ids=[" ".join(c[0][-2:]) for c in CASES])
def test_bad_number_is_one_clear_error(argv, option, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert option in err and message in err and "Traceback" not in err


@pytest.mark.parametrize("extra", [["--draft", "ngram"], ["--grammar", "json"], ["--schema", "s.json"]])
def test_prefix_cache_with_a_drafter_is_refused_not_ignored(extra, tmp_path, capsys):
    assert main(GEN + ["--prefix-cache", str(tmp_path / "pc")] + extra) == 2
    assert "cannot be combined" in capsys.readouterr().err
    assert not (tmp_path / "pc").exists()
