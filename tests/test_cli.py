"""The command line: one JSON object with --json, clear errors with exit code 2, benches that run."""
import json
import subprocess
import sys

import pytest

from lessonkit.cli import main
from tests.hf_tiny import make_hf


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    _, stream = make_hf("olmoe", tmp_path_factory.mktemp("cli"))
    return stream


def test_generate_json(moe_dir, capsys):
    assert main(["generate", "--model", str(moe_dir), "--prompt", "hello", "--max-new-tokens", "5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"] == moe_dir.name and len(out["token_ids"]) == 5
    for k in ("new_tokens", "forwards", "wall_s", "tokens_per_s", "expert_hits", "expert_misses", "bytes_read"):
        assert k in out["stats"]
    assert out["stats"]["forwards"] == 5 and out["stats"]["new_tokens"] == 5


def test_generate_is_deterministic_under_sampling(moe_dir, capsys):
    args = ["generate", "--model", str(moe_dir), "--prompt", "abc", "--max-new-tokens", "8", "--json",
            "--temperature", "0.9", "--top-p", "0.9", "--seed", "7"]
    main(args)
    a = json.loads(capsys.readouterr().out)["token_ids"]
    main(args)
    b = json.loads(capsys.readouterr().out)["token_ids"]
    assert a == b


@pytest.mark.parametrize("argv, needle", [
    (["generate", "--model", "no-such-model", "--prompt", "x"], "unknown model 'no-such-model'"),
    (["generate", "--model", "/nonexistent/dir", "--prompt", "x"], "unknown model"),
    (["train", "tiny-moe", "--measure-only"], "tiny-moe is not a drafter"),
    (["train", "judge", "--model", "tiny-moe", "--measure-only"], "--measure-only re-measures a drafter"),
])
def test_bad_input_is_one_line_and_exit_2(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_budget_below_one_expert_via_cli(moe_dir, capsys):
    rc = main(["generate", "--model", str(moe_dir), "--prompt", "x", "--expert-budget-mb", "0.0001"])
    assert rc == 2 and "smaller than one expert" in capsys.readouterr().err


def test_python_dash_m_entry_point(moe_dir):
    r = subprocess.run([sys.executable, "-m", "lessonkit", "generate", "--model", str(moe_dir / "missing"),
                        "--prompt", "x"], capture_output=True, text=True)
    assert r.returncode == 2 and "lessonkit: error:" in r.stderr


def test_bench_engine_smoke(moe_dir, capsys):
    assert main(["bench", "engine", "--smoke", "--json", "--model", str(moe_dir)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["bench"] == "engine" and out["rows"] and out["targets"]
    assert all(r["identical_to_plain"] for r in out["rows"])


def test_compare_reports_moves(tmp_path, capsys):
    a = {"lessons": {"01": {"figures": {"speedup": 1.0, "acc": 0.5}}}}
    b = {"lessons": {"01": {"figures": {"speedup": 1.5, "acc": 0.52}}}}
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    assert main(["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 1
    out = capsys.readouterr().out
    assert "01.speedup" in out and "01.acc" not in out


def test_doctor_passes_on_the_shipped_files(capsys):
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "tiny-moe/experts.safetensors: ok" in out and "sha256 matches" in out
    assert "draft turn of dense drafters" in out
    assert "generate without torch (smollm2-135m, greedy): yes" in out
    assert "feature-head/smollm2-135m/head.safetensors: ok" in out


def test_manifest_catches_an_edited_byte(moe_dir, tmp_path):
    import shutil
    from lessonkit.models.integrity import verify_manifest
    d = tmp_path / "copy"
    shutil.copytree(moe_dir, d)
    assert set(verify_manifest(d).values()) == {"ok"}
    data = bytearray((d / "experts.safetensors").read_bytes())
    data[-1] ^= 1
    (d / "experts.safetensors").write_bytes(bytes(data))
    assert verify_manifest(d)["experts.safetensors"] == "MISMATCH"


@pytest.mark.parametrize("name", ["spec", "mtp", "grammar", "grammar-masks", "semcache"])
def test_bench_smoke_runs_once(name, capsys):
    """Every benchmark runs once at tiny size (engine, prefix and stack have their own smoke tests)."""
    assert main(["bench", name, "--smoke", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["bench"] == name and out["rows"] and out["targets"]
    assert all({"name", "value", "target", "met"} <= set(t) for t in out["targets"])


def test_help_is_quick_and_imports_no_torch_or_technique():
    """Building the parser imports the command table only; each command imports its code when it runs."""
    allowed = {"lessonkit.cli", "lessonkit.commands", "lessonkit.bench", "lessonkit.files", "lessonkit.errors",
               "lessonkit.files.resources",       # the resolver `import lessonkit` exports: pathlib and importlib only
               "lessonkit.speculative", "lessonkit.speculative.depth",   # --draft-k's parser: argparse and errors only
               "lessonkit.engine", "lessonkit.engine.threads",          # --threads' limit, MAX_THREADS: contextlib only
               "lessonkit.files.disk",                                  # --disk's parser: os, mmap and errors only
               "lessonkit.files.home_cache"}                            # cache --clear's kinds: fnmatch, shutil only
    code = ("import sys, time; t = time.perf_counter(); from lessonkit.cli import build_parser; build_parser(); "
            "print(time.perf_counter() - t); "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('lessonkit.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert float(out[0]) < 1.0, out
    assert set(eval(out[1])) <= allowed, out[1]
    t = subprocess.run([sys.executable, "-m", "lessonkit", "--help"], capture_output=True, text=True)
    assert t.returncode == 0 and "benchmarks" in t.stdout


def test_command_table_choices_match_the_code():
    """The table spells some choices out (so that building it imports nothing); they must match the code."""
    from lessonkit.cli import COMMANDS
    from lessonkit.semcache.policies import POLICY_NAMES
    from lessonkit.workloads.corpus import PRESETS as CORPUS_PRESETS
    from lessonkit.training.tiny_models import PRESETS as TRAIN_PRESETS

    def choices(entry, flag):
        return next(kw["choices"] for flags, kw in entry[2] if flag in flags)
    from lessonkit.training.cut_draft import PRESETS as CUT_PRESETS
    from lessonkit.training.judge import PRESETS as JUDGE_PRESETS
    assert sorted(choices(COMMANDS["train"], "name")) == sorted([*TRAIN_PRESETS, *CUT_PRESETS, "judge"])
    assert sorted(choices(COMMANDS["train"], "--model")) == sorted(JUDGE_PRESETS)
    assert sorted(choices(COMMANDS["corpus"][1]["build"], "--preset")) == sorted(CORPUS_PRESETS)
    assert tuple(choices(COMMANDS["semcache"][1]["run"], "--policy")) == POLICY_NAMES


def test_every_command_with_an_out_folder_takes_force():
    """main() keeps a user's --out unless --force: a command that has --out must have --force too, or it crashes
    before it starts (train-head did)."""
    from lessonkit.cli import build_parser
    ap = build_parser()
    subs = [a for a in ap._actions if a.__class__.__name__ == "_SubParsersAction"]
    stack, missing = [(n, p) for s in subs for n, p in s.choices.items()], []
    while stack:
        name, p = stack.pop()
        inner = [a for a in p._actions if a.__class__.__name__ == "_SubParsersAction"]
        stack += [(f"{name} {n}", q) for s in inner for n, q in s.choices.items()]
        dests = {a.dest for a in p._actions}
        if "out" in dests and "force" not in dests and "measure_only" not in dests:
            missing.append(name)
    assert missing == []
