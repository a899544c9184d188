"""Kill tests (issue 45): a process killed with SIGKILL at a random moment while it writes leaves nothing
that a later run loads wrongly -- the later run rebuilds or refuses, and the next clean run gives the
reference answer. Three writers: `generate --prefix-cache`, model conversion (convert_hf_checkpoint) and
the judge's training (train_adapter + save_adapter).

The child (tests/kill_child.py) writes through a slow disk of its own (every write in 8 KiB pieces with a
2 ms pause), so the writes take long enough to be hit. The kill point is chosen by time: this process
watches the target directory for the writer's first write (a temporary file `.tmp-<pid>-*.part`, or
any file created or changing size) and kills a uniformly random delay after it (within the write window of an uninterrupted run); each kill's
point (the delay, the temporary files present, whether the process had already finished) is recorded.
After each kill, every file in the directory other than a dead writer's temporary file must be whole
(fuzz_run.torn_files), and then:
  prefix cache  a later `generate --prefix-cache DIR` gives the tokens of plain generate
  conversion    a later load refuses or gives the reference tokens; converting again gives the
                reference files byte for byte and the reference tokens
  judge         each file is the old one or the whole new one; the adapter reads as the old or the new
                tensors (or is refused); saving again gives the reference files

The short run (the suite) kills each writer twice with fixed seeds; LESSONKIT_FUZZ=long kills each
KILLS_LONG times with fresh seeds and adds the counts and kill points to build/fuzz/report.json.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import fuzz_run as fr
from fuzz_cli import ROOT
from lessonkit.cli import main
from lessonkit.files.atomic import TMP_PREFIX, atomic_write

LONG = os.environ.get("LESSONKIT_FUZZ") == "long"
KILLS_LONG = 20
KILLS = KILLS_LONG if LONG else 2
SEED = random.SystemRandom().randrange(2**32) if LONG else 0
CHILD = Path(__file__).resolve().parent / "kill_child.py"
# seconds from a writer's first temporary file to its exit, uninterrupted on the slow disk (measured on
# this 2-core machine, with margin): the kill delays are drawn below these
WINDOW_S = {"prefix-cache": 0.6, "convert": 0.5, "judge": 0.3}
PROMPT = ("The river keeps its own counsel, and the mill by the water turns whether or not anyone listens. "
          "Every morning the miller counts the sacks, writes the number in a ledger and closes the door. ") * 2
REPORT: dict = {}


# ---- spawning, watching, killing ---------------------------------------------------------------------------------------
def child_env(home: Path) -> dict:
    return {**os.environ, "HOME": str(home), "LESSONKIT_HOME": str(home / "lessonkit"), "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"}


def temps(d: Path) -> list[str]:
    out = []
    for dirpath, dirnames, filenames in os.walk(d):
        out += [os.path.relpath(os.path.join(dirpath, f), d) for f in filenames if f.startswith(TMP_PREFIX)]
    return out


def sizes(d: Path) -> dict:
    out = {}
    for dirpath, _, filenames in os.walk(d):
        for f in filenames:
            with contextlib.suppress(OSError):
                out[os.path.join(dirpath, f)] = os.stat(os.path.join(dirpath, f)).st_size
    return out


def run_and_kill(args: list, watch: Path, home: Path, delay_s: float | None) -> dict:
    """Start the child, wait for its first write under `watch` (a temporary file, or any file created or
    changing size: a writer that writes in place is caught too), then SIGKILL it delay_s later (None: let
    it finish). Returns the kill point."""
    start = sizes(watch)
    t0 = time.monotonic()
    p = subprocess.Popen([sys.executable, str(CHILD), *args], env=child_env(home), cwd=home,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    seen = None
    while p.poll() is None and time.monotonic() - t0 < 300:
        if seen is None and (temps(watch) or sizes(watch) != start):
            seen = time.monotonic()
        if seen is not None and delay_s is not None and time.monotonic() - seen >= delay_s:
            break
        time.sleep(0.001)
    point = {"delay_ms": None if delay_s is None else round(delay_s * 1000, 1),
             "write_seen": seen is not None, "temps_at_kill": temps(watch)}
    point["finished_first"] = p.poll() is not None
    if not point["finished_first"]:
        os.kill(p.pid, signal.SIGKILL)
    _, err = p.communicate(timeout=60)
    point["exit"] = p.returncode
    point["since_first_write_ms"] = None if seen is None else round((time.monotonic() - seen) * 1000, 1)
    if point["finished_first"] and p.returncode != 0:
        raise AssertionError(f"the child failed on its own (exit {p.returncode}): {err.decode()[-2000:]}")
    return point


def whole(d: Path, before: dict) -> list[str]:
    """Files under d that are not whole, a dead writer's temporary files aside (a later writer removes them)."""
    return [f"{k}: {v}" for k, v in fr.torn_files(d, before).items() if v != "a temporary file left behind"]


def cli_json(argv: list) -> tuple[int, dict | None, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, (json.loads(out.getvalue()) if code == 0 else None), err.getvalue()


def record(component: str, point: dict, outcome: str, problems: list[str]) -> None:
    c = REPORT.setdefault(component, {"kills": 0, "landed_while_writing": 0, "finished_before_the_kill": 0,
                                      "wrong_loads": 0, "torn_files": 0, "outcomes": {}, "kill_points": []})
    c["kills"] += 1
    c["landed_while_writing"] += bool(point["temps_at_kill"]) and not point["finished_first"]
    c["finished_before_the_kill"] += point["finished_first"]
    c["torn_files"] += sum(1 for p in problems if p.startswith("torn"))
    c["wrong_loads"] += sum(1 for p in problems if p.startswith("wrong"))
    c["outcomes"][outcome] = c["outcomes"].get(outcome, 0) + 1
    c["kill_points"].append({**point, "outcome": outcome, "problems": problems})
    write_report()


def write_report() -> None:
    """The kill counts under "kill" in build/fuzz/report.json (long) or report-short.json (the suite)."""
    out = ROOT / "build" / "fuzz" / ("report.json" if LONG else "report-short.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        doc = json.loads(out.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        doc = {}
    doc["kill"] = {"seed": SEED, **REPORT}
    atomic_write(out, json.dumps(doc, indent=1, sort_keys=True).encode("utf-8"))


def delays(component: str) -> list[float]:
    rng = random.Random(f"{SEED}-{component}")
    return [rng.uniform(0, WINDOW_S[component]) for _ in range(KILLS)]


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("kill-home")


# ---- generate --prefix-cache ---------------------------------------------------------------------------------------
def test_generate_with_a_prefix_cache_killed_while_writing(tmp_path, home, monkeypatch):
    monkeypatch.setenv("LESSONKIT_HOME", str(home / "lessonkit"))
    plain = ["generate", "--model", "tiny-moe", "--prompt", PROMPT, "--max-new-tokens", "4", "--json"]
    code, ref, _ = cli_json(plain)
    assert code == 0
    rng = random.Random(f"{SEED}-prefix-start")
    problems_all = []
    for i, delay in enumerate(delays("prefix-cache")):
        d = tmp_path / f"pc{i}"
        start = rng.choice(["empty", "a shorter prompt cached", "missing"])
        if start != "missing":
            d.mkdir()
        if start == "a shorter prompt cached":
            assert cli_json(["generate", "--model", "tiny-moe", "--prompt", PROMPT[: len(PROMPT) // 3],
                             "--max-new-tokens", "1", "--json", "--prefix-cache", str(d)])[0] == 0
        before = fr.tree_digest(d, content=False) if d.exists() else {}
        d.mkdir(exist_ok=True)           # watched from the start; the child creates kv/ itself
        point = run_and_kill(["prefix-cache", str(d), PROMPT], d, home, delay)
        point["start"] = start
        problems = [f"torn: {t}" for t in whole(d, before)]
        code, got, err = cli_json(plain + ["--prefix-cache", str(d)])         # the later run
        if code != 0 or got["token_ids"] != ref["token_ids"] or got["text"] != ref["text"]:
            problems.append(f"wrong: later run exit {code}, tokens {got and got['token_ids']} != {ref['token_ids']}: {err[-300:]}")
        left = [t for t in temps(d)]
        if left:
            problems.append(f"torn: temporary files of the dead writer still there after the later run: {left}")
        record("generate --prefix-cache", point, "later run gave the reference tokens" if not problems else "defect",
               problems)
        problems_all += [f"kill {i} ({point}): {p}" for p in problems]
    assert not problems_all, "\n".join(problems_all)


# ---- model conversion ----------------------------------------------------------------------------------------------
def test_model_conversion_killed_while_writing(tmp_path, home, monkeypatch):
    from hf_tiny import make_hf
    monkeypatch.setenv("LESSONKIT_HOME", str(home / "lessonkit"))
    _, ref_dir = make_hf("olmoe", tmp_path / "ref")
    _, old_dir = make_hf("olmoe", tmp_path / "old", seed=1)           # what the output directory held before
    hf = tmp_path / "ref" / "hf-olmoe"
    ref_files = {k: v for k, v in fr.tree_digest(ref_dir).items()}
    gen = ["--prompt", "hello river", "--max-new-tokens", "5", "--json"]
    code, ref, _ = cli_json(["generate", "--model", str(ref_dir), *gen])
    assert code == 0
    rng = random.Random(f"{SEED}-convert-start")
    problems_all = []
    for i, delay in enumerate(delays("convert")):
        out = tmp_path / f"out{i}"
        start = rng.choice(["empty", "another model converted there"])
        if start == "empty":
            out.mkdir()
        else:
            shutil.copytree(old_dir, out)
        before = fr.tree_digest(out, content=False)
        point = run_and_kill(["convert", str(hf), str(out)], out, home, delay)
        point["start"] = start
        problems = [f"torn: {t}" for t in whole(out, before)]
        code, got, err = cli_json(["generate", "--model", str(out), *gen])          # a later run loads it
        if code == 0 and got["token_ids"] != ref["token_ids"]:
            old_code, old, _ = cli_json(["generate", "--model", str(old_dir), *gen])
            if got["token_ids"] != old["token_ids"] or not point["temps_at_kill"] and not point["finished_first"]:
                problems.append(f"wrong: the later run loaded a mixture: tokens {got['token_ids']}, reference "
                                f"{ref['token_ids']}, old model {old['token_ids']}")
            outcome = "later run: the old model, whole"
        else:
            outcome = "later run: the reference tokens" if code == 0 else "later run: refused"
        from lessonkit.models.convert import convert_hf_checkpoint
        convert_hf_checkpoint(hf, out)                                              # the next clean run
        now = fr.tree_digest(out)
        left = [k for k in now if Path(k).name.startswith(TMP_PREFIX)]
        if left:
            problems.append(f"left behind: the killed conversion's temporary files after converting again: {left}")
        now = {k: v for k, v in now.items() if k not in left}
        if now != ref_files:
            problems.append(f"wrong: converting again differs from the reference: "
                            f"{sorted(k for k in set(now) | set(ref_files) if now.get(k) != ref_files.get(k))}")
        code, again, _ = cli_json(["generate", "--model", str(out), *gen])
        if code != 0 or again["token_ids"] != ref["token_ids"]:
            problems.append(f"wrong: after converting again: exit {code}, {again and again['token_ids']}")
        record("convert", point, outcome if not problems else "defect", problems)
        problems_all += [f"kill {i} ({point}): {p}" for p in problems]
    assert not problems_all, "\n".join(problems_all)


# ---- the judge's training ------------------------------------------------------------------------------------------
class _Fixed:
    def __init__(self, tensors):
        self.tensors = tensors

    def adapter_tensors(self):
        return dict(self.tensors)


def test_judge_training_killed_while_writing(tmp_path, home, monkeypatch):
    import torch
    from safetensors.torch import load_file

    from kill_child import TINY_JUDGE
    from lessonkit.models.adapters import read_adapter
    from lessonkit.errors import LessonkitError
    from lessonkit.training.judge import JudgeTrainConfig, save_adapter
    monkeypatch.setenv("LESSONKIT_HOME", str(home / "lessonkit"))
    cfg = JudgeTrainConfig(**TINY_JUDGE)
    # the reference: one uninterrupted child run (training is seeded and deterministic)
    ref_dir = tmp_path / "reference"
    ref_dir.mkdir()
    run_and_kill(["judge", str(ref_dir)], ref_dir, home, None)
    ref = {f.name: f.read_bytes() for f in ref_dir.iterdir()}
    ref_t = load_file(ref_dir / "adapter.safetensors")
    ref_log = json.loads(ref["train_log.json"])
    g = torch.Generator().manual_seed(1)
    old_t = {k: torch.randn(v.shape, generator=g) for k, v in ref_t.items()}
    old_dir = tmp_path / "old"
    save_adapter(_Fixed(old_t), cfg, {"losses": [0.0]}, old_dir)
    old = {f.name: f.read_bytes() for f in old_dir.iterdir()}
    rng = random.Random(f"{SEED}-judge-start")
    problems_all = []
    for i, delay in enumerate(delays("judge")):
        out = tmp_path / f"judge{i}"
        start = rng.choice(["empty", "an older adapter"])
        shutil.copytree(old_dir, out) if start != "empty" else out.mkdir()
        before = fr.tree_digest(out, content=False)
        point = run_and_kill(["judge", str(out)], out, home, delay)
        point["start"] = start
        problems = [f"torn: {t}" for t in whole(out, before)]
        for f in out.iterdir():
            if not f.name.startswith(TMP_PREFIX) and f.read_bytes() not in (ref.get(f.name), old.get(f.name)):
                problems.append(f"torn: {f.name} is neither the old file nor the whole new one")
        try:                                                                          # a later run loads it
            _, got = read_adapter(out)
            which = [n for n, t in (("new", ref_t), ("old", old_t))
                     if got.keys() == t.keys() and all(torch.equal(got[k], t[k]) for k in t)]
            outcome = f"later run: the {which[0]} adapter" if which else "defect"
            if not which:
                problems.append("wrong: the adapter read is neither the old nor the new one")
        except LessonkitError:
            outcome = "later run: refused"
        save_adapter(_Fixed(ref_t), cfg, ref_log, out)                                # the next clean run
        now = {f.name: f.read_bytes() for f in out.iterdir() if not f.name.startswith(TMP_PREFIX)}
        if now != ref:
            problems.append(f"wrong: saving again differs from the reference: {sorted(k for k in now if now[k] != ref.get(k))}")
        record("judge training", point, outcome if not problems else "defect", problems)
        problems_all += [f"kill {i} ({point}): {p}" for p in problems]
    assert not problems_all, "\n".join(problems_all)
