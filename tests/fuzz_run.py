"""Running the fuzz layer's cases (tests/fuzz_cli.py builds them): in a worker process through
lessonkit.cli.main, or as real `python -m lessonkit` processes, and the rules each must keep."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fuzz_cli import ROOT, make_victim, materialise, tree_digest  # noqa: E402
from lessonkit.cli import main  # noqa: E402  (the worker imports torch once, not per case)

MEM_LIMIT_MB = 3072          # RLIMIT_AS of every worker and subprocess (address space, not resident)
RSS_BOUND_MB = 1536          # peak resident memory a case may reach
CASE_TIMEOUT_S = 90          # a case running longer is a hang


# ---- running the cases ---------------------------------------------------------------------------------------------
def limit_memory() -> None:
    """preexec_fn / worker start: cap the address space at MEM_LIMIT_MB."""
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (MEM_LIMIT_MB << 20, MEM_LIMIT_MB << 20))


def fuzz_env(sandbox: Path) -> dict:
    home = sandbox / "home"
    home.mkdir(parents=True, exist_ok=True)
    return {**os.environ, "HOME": str(home), "LESSONKIT_HOME": str(home / "lessonkit"), "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore::DeprecationWarning"}


def damage_home(spec, victim: Path) -> None:
    """Put the damaged memo in place of $LESSONKIT_HOME/verified.json, and take the last case's damage
    away before a case without (a memo the workbook wrote itself stays: no hashing the model again)."""
    home = Path(os.environ["LESSONKIT_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    memo, marker = home / "verified.json", home / "memo-damaged"
    if spec or marker.exists():
        if memo.is_dir() and not memo.is_symlink():
            shutil.rmtree(memo)
        elif memo.exists() or memo.is_symlink():
            memo.unlink()
        marker.unlink(missing_ok=True)
    if spec:
        built = Path(materialise(spec, home, victim))
        if built.exists() or built.is_symlink():
            built.rename(memo)
        marker.touch()


def run_one(case: dict, where: Path, victim: Path) -> dict:
    """One case in this process through lessonkit.cli.main (the worker's loop body)."""
    import contextlib
    import io
    import resource
    import signal
    import traceback

    where.mkdir(parents=True)
    argv = [materialise(a, where, victim) for a in case["argv"]]
    damage_home(case.get("home"), victim)
    before, data_before = tree_digest(victim), tree_digest(ROOT / "data", content=False)
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict", write_through=True)  # a terminal's
    err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="backslashreplace", write_through=True)
    res = {"argv": case["argv"], "home": case.get("home"), "code": None, "traceback": None}

    def alarm(*_):
        raise TimeoutError(f"case ran past {CASE_TIMEOUT_S} s")
    signal.signal(signal.SIGALRM, alarm)
    signal.alarm(CASE_TIMEOUT_S)
    cwd = os.getcwd()
    try:
        os.chdir(where)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            res["code"] = main(argv)
    except SystemExit as e:
        res["code"] = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:          # noqa: B902 -- anything escaping main is a traceback for the user
        res["traceback"] = re.sub(r"(.)\1{40,}", r"\1\1\1...", traceback.format_exc())[-3000:]
    finally:
        signal.alarm(0)
        os.chdir(cwd)
    res["stderr"] = err.buffer.getvalue().decode("utf-8", "replace")[-2000:]
    res["victim_changed"] = tree_digest(victim) != before
    res["data_changed"] = tree_digest(ROOT / "data", content=False) != data_before
    res["rss_mb"] = peak_rss_mb()
    shutil.rmtree(where, ignore_errors=True)
    return res


def peak_rss_mb() -> int:
    """This process's peak resident set (VmHWM). Not ru_maxrss: Linux keeps that across fork + exec, so a
    process started from a large pytest worker would report the worker's size, not its own."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) >> 10
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10


# `python -c HWM_MAIN HWM_FILE ARGS...`: lessonkit's main, then its VmHWM written to HWM_FILE at exit
HWM_MAIN = ("import atexit, runpy, sys\n"
            "out = sys.argv.pop(1)\n"
            "def hwm():\n"
            "    line = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')][0]\n"
            "    open(out, 'w').write(line.split()[1])\n"
            "atexit.register(hwm)\n"
            "sys.argv[0] = 'lessonkit'\n"
            "runpy.run_module('lessonkit', run_name='__main__', alter_sys=True)\n")


def worker_main(cases_file: str, out_file: str, sandbox: str) -> None:
    """`python tests/fuzz_cli.py CASES OUT SANDBOX`: run every case, one JSON line each."""
    limit_memory()
    sandbox_p = Path(sandbox)
    victim = make_victim(sandbox_p)
    cases = json.loads(Path(cases_file).read_text())
    with open(out_file, "w") as out:
        for i, case in enumerate(cases):
            res = run_one(case, sandbox_p / f"case{i}", victim)
            out.write(json.dumps(res, default=repr) + "\n")
            out.flush()


def run_worker(cases: list, sandbox: Path, timeout_s: float) -> list[dict]:
    """Run the cases in fresh interpreters under the memory limit, one after another in each; a case
    whose worker died (killed, out of memory in C, a crash, past the time) is reported as such and
    the next worker goes on after it."""
    done: list[dict] = []
    while len(done) < len(cases):
        box = sandbox / f"worker{len(done)}"
        box.mkdir(parents=True, exist_ok=True)
        (box / "cases.json").write_text(json.dumps(cases[len(done):]))
        out = box / "results.jsonl"
        try:
            r = subprocess.run([sys.executable, __file__, str(box / "cases.json"), str(out), str(box)],
                               cwd=box, env=fuzz_env(box), capture_output=True, timeout=timeout_s)
            tail = r.stderr.decode("utf-8", "replace")[-2000:]
        except subprocess.TimeoutExpired:
            tail = f"worker ran past {timeout_s} s"
        done += [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
        if len(done) < len(cases):
            done.append({"argv": cases[len(done)]["argv"], "code": None, "traceback": f"worker died here: {tail}",
                         "stderr": "", "victim_changed": False, "data_changed": False, "rss_mb": 0})
    return done


def run_subprocess(case: dict, sandbox: Path) -> dict:
    """The case as a user runs it: lessonkit's main in a fresh interpreter with argv as bytes (invalid UTF-8 as
    given), its peak memory read by the process itself (HWM_MAIN)."""
    where = sandbox / "sub"
    shutil.rmtree(where, ignore_errors=True)
    where.mkdir(parents=True)
    victim = make_victim(sandbox)
    argv = [os.fsencode(materialise(a, where, victim)) for a in case["argv"]]
    before, data_before = tree_digest(victim), tree_digest(ROOT / "data", content=False)
    hwm = sandbox / "hwm.txt"
    hwm.unlink(missing_ok=True)
    try:
        r = subprocess.run([sys.executable, "-c", HWM_MAIN, str(hwm), *argv], cwd=where, env=fuzz_env(sandbox),
                           capture_output=True, timeout=CASE_TIMEOUT_S, preexec_fn=limit_memory)
        code, err = r.returncode, r.stderr.decode("utf-8", "replace")
    except subprocess.TimeoutExpired:
        code, err = None, f"ran past {CASE_TIMEOUT_S} s"
    return {"argv": case["argv"], "code": code, "stderr": err[-2000:],
            "traceback": err[-3000:] if "Traceback" in err or code is None else None,
            "victim_changed": tree_digest(victim) != before,
            "data_changed": tree_digest(ROOT / "data", content=False) != data_before,
            "rss_mb": int(hwm.read_text()) >> 10 if hwm.exists() else 0}


def defects(results: list[dict]) -> list[str]:
    """One line per broken rule: exit code outside {0, 1, 2}, a traceback or hang, a file outside the
    expected directories changed, memory past RSS_BOUND_MB."""
    out = []
    for r in results:
        why = []
        if r["traceback"]:
            why.append("traceback/hang: " + r["traceback"].strip().splitlines()[-1][:300])
        elif r["code"] not in (0, 1, 2):
            why.append(f"exit code {r['code']!r}")
        if r["victim_changed"] or r["data_changed"]:
            why.append("changed a file outside the expected directories")
        if r["rss_mb"] > RSS_BOUND_MB:
            why.append(f"peak memory {r['rss_mb']} MB")
        if why:
            home = f" [verified.json: {r['home']['variant']}]" if r.get("home") else ""
            out.append(f"{short(r['argv'])}{home}: {'; '.join(why)}")
    return out


def short(argv) -> str:
    """An argv for a report line: placeholders as kind:variant, long strings cut."""
    parts = []
    for a in argv:
        if isinstance(a, dict):
            a = f"<{a['file']}:{a['variant']}" + (f":{a['member']}:{a['member_variant']}>" if a["variant"] == "member" else ">")
        parts.append(ascii(a)[1:-1][:40])
    return " ".join(parts)


if __name__ == "__main__":
    worker_main(*sys.argv[1:4])
