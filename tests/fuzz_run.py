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
from fuzz_cli import ROOT, clean_case, content_damaged, make_victim, materialise, tree_digest  # noqa: E402
from lessonkit.cli import main  # noqa: E402  (the worker imports torch once, not per case)

MEM_LIMIT_MB = int(os.environ.get("LESSONKIT_FUZZ_AS_MB", 3072))   # RLIMIT_AS of every worker and subprocess (MB of
#                                   address space, not resident; tests/test_fuzz.py's fixed cases try a tighter one)
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


def invoke(argv: list, where: Path) -> dict:
    """lessonkit.cli.main(argv) in this process with cwd = where: exit code, stdout, stderr, traceback."""
    import contextlib
    import io
    import signal
    import traceback

    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict", write_through=True)  # a terminal's
    err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="backslashreplace", write_through=True)
    res = {"code": None, "traceback": None}

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
    res["stdout"] = out.buffer.getvalue().decode("utf-8", "replace")
    res["stderr"] = err.buffer.getvalue().decode("utf-8", "replace")[-2000:]
    return res


def run_one(case: dict, where: Path, victim: Path) -> dict:
    """One case in this process through lessonkit.cli.main (the worker's loop body): the rules, then its
    answer against the same command on clean inputs, then every file it wrote checked whole."""
    where.mkdir(parents=True)
    argv = [materialise(a, where, victim) for a in case["argv"]]
    damage_home(case.get("home"), victim)
    home = Path(os.environ["LESSONKIT_HOME"])
    before, data_before = tree_digest(victim), tree_digest(ROOT / "data", content=False)
    written_before = {r: tree_digest(r, content=False) for r in (where, home)}
    res = {"argv": case["argv"], "home": case.get("home"), "component": component(case["argv"]),
           **invoke(argv, where)}
    res["victim_changed"] = tree_digest(victim) != before
    res["data_changed"] = tree_digest(ROOT / "data", content=False) != data_before
    res["rss_mb"] = peak_rss_mb()
    res["torn"] = [f"{f}: {why}" for r in (where, home) for f, why in torn_files(r, written_before[r]).items()]
    res["answer"] = check_answer(case, argv, res, where, victim)
    res["stdout"] = res["stdout"][-4000:]          # kept short in the results once its answer is checked
    shutil.rmtree(where, ignore_errors=True)
    return res


# ---- answers: a case that exits 0 gives the answer of the same command on clean inputs -------------------------------
VERDICTS = {"compare", "grammar check"}          # exit 1 is an answer there too (figures moved, a file not in the language)
PC_PROMPT = "The river keeps its own counsel"   # the prompt of the prefix-cache template (fuzz_cli.prefix_cache_template)
_REFERENCE: dict = {}                           # clean argv -> (code, answer): computed once per worker


def component(argv: list) -> str:
    words = [a for a in argv[:2] if isinstance(a, str) and not a.startswith("-")]
    return "grammar " + words[1] if words[:1] == ["grammar"] and len(words) > 1 else (words[0] if words else "?")


def answer_of(comp: str, argv: list, r: dict, where: Path | None = None):
    """The part of a command's output that is its answer (timings and stats left out), the case's own
    directory written <case> (the same command on clean inputs runs in another one)."""
    ans = _answer(comp, argv, r)
    if where is None:
        return ans
    return json.loads(json.dumps(ans).replace(json.dumps(str(where))[1:-1], "<case>"))


def _answer(comp: str, argv: list, r: dict):
    out = r["stdout"]
    if "--json" in argv and comp in ("generate", "grammar check", "models", "gap"):
        try:
            doc = json.loads(out)
        except ValueError:
            return ("not JSON", out[-300:])
        if comp == "generate":
            return {k: doc.get(k) for k in ("text", "token_ids")} | {"finish": doc.get("stats", {}).get("finish_reason")}
        if comp == "grammar check":
            return [(f.get("ok"), f.get("error_offset")) for f in doc.get("files", [])]
        if comp == "models":
            return [(m.get("name"), m.get("params")) for m in doc]
        return doc
    if comp == "grammar check":                  # PATH: ok / PATH: NOT in language at byte N (...), in order
        return [m.group(1) for m in re.finditer(r": (ok|NOT in language at byte \d+)", out)]
    if comp == "export":
        d = Path(argv[2])
        return sorted((str(f.relative_to(d)), _sha(f)) for f in d.rglob("*") if f.is_file()) if d.is_dir() else None
    if comp == "models":
        return [ln.split()[0] for ln in out.splitlines() if ln.strip()]
    return out


def _sha(f: Path) -> str:
    import hashlib
    return hashlib.sha256(f.read_bytes()).hexdigest()


def reference(case: dict, victim: Path, box: Path) -> tuple:
    """(exit code, answer) of the case's command on clean inputs: every file valid, no damaged memo."""
    clean = clean_case(case)
    key = json.dumps(clean["argv"], sort_keys=True)
    if key not in _REFERENCE:
        where = box / f"ref{len(_REFERENCE)}"
        where.mkdir(parents=True)
        damage_home(None, victim)
        argv = [materialise(a, where, victim) for a in clean["argv"]]
        r = invoke(argv, where)
        if r["code"] == 2 and "lessonkit: error: out of " in r["stderr"]:
            r = fresh(argv, where)       # this worker ran out (what earlier cases left), not the command: ask a new process
        _REFERENCE[key] = (r["code"], answer_of(component(case["argv"]), argv, r, where))
        shutil.rmtree(where, ignore_errors=True)
    return _REFERENCE[key]


def fresh(argv: list, where: Path) -> dict:
    """`python -m lessonkit ARGV` in a new interpreter under the same limits: exit code, stdout, stderr."""
    r = subprocess.run([sys.executable, "-m", "lessonkit", *argv], cwd=where, capture_output=True, text=True,
                       timeout=CASE_TIMEOUT_S, preexec_fn=limit_memory)
    return {"code": r.returncode, "stdout": r.stdout, "stderr": r.stderr[-2000:], "traceback": None}


def restored_tokens(pcdir: str, where: Path):
    """`generate --prefix-cache DIR` on a cache a case left behind: (exit code, token ids) -- a cache that
    restores a state is right only if the tokens are those of a plain prefill."""
    r = invoke(["generate", "--model", "tiny-moe", "--prompt", PC_PROMPT, "--max-new-tokens", "3", "--json",
                "--prefix-cache", pcdir], where)
    return r["code"], answer_of("generate", ["--json"], r) if r["code"] == 0 else None


def check_answer(case: dict, argv: list, res: dict, where: Path, victim: Path) -> str:
    """'right', 'WRONG: ...' or 'not checked: why'. Inputs whose content is the question (a schema, a
    document, a summary, Epoch's data) change the answer when damaged: those cases are not compared. Damage
    the workbook must detect or repair (a model, a prefix cache, the hash memo, an output directory) must
    leave the clean answer or a refusal."""
    comp = res["component"]
    verdicts = []
    if res["traceback"] is None and (res["code"] == 0 or (res["code"] == 1 and comp in VERDICTS)):
        if content_damaged(case):
            verdicts.append("not checked: an input's content was damaged")
        elif comp == "prefix-cache" and any(isinstance(a, dict) and a["variant"] != "valid" for a in case["argv"]):
            pass                         # a damaged cache's inventory differs: its answer is what it restores (below)
        else:
            code, want = reference(case, victim, where.parent)
            got = answer_of(comp, argv, res, where)
            verdicts.append("right" if (code, want) == (res["code"], got) else
                            f"WRONG: exit {res['code']} {str(got)[:200]!r}, clean inputs: exit {code} {str(want)[:200]!r}")
    pcdirs = [a for spec, a in zip(case["argv"], argv) if isinstance(spec, dict) and spec["file"] == "pcdir"]
    for d in pcdirs:                     # whatever the case did to a cache, what it restores now is a plain prefill's
        if Path(d).is_dir():             # (a symlinked one leads to the case's own `linked` directory)
            code, got = restored_tokens(d, where)
            _, want = reference({"argv": ["generate", "--model", "tiny-moe", "--prompt", PC_PROMPT, "--max-new-tokens",
                                          "3", "--json"]}, victim, where.parent)
            verdicts.append("right" if code != 0 or got == want else f"WRONG: the cache restored {got}, plain: {want}")
    if not verdicts:
        return "not checked: exit " + str(res["code"])
    wrong = [v for v in verdicts if v.startswith("WRONG")]
    return wrong[0] if wrong else "right" if "right" in verdicts else verdicts[0]


# ---- torn files: every file the workbook wrote is whole ------------------------------------------------------------
def torn_files(root: Path, before: dict) -> dict:
    """{file: why} for each file under root, new or changed since `before` (tree_digest(content=False)),
    that is not whole: a temporary file left behind, JSON that does not parse, a safetensors file shorter
    than its header says, a manifest whose checksums do not match its files."""
    from lessonkit.engine.checkpoint import parse_safetensors_header
    bad = {}
    now = tree_digest(root, content=False)
    for rel, sig in now.items():
        f = Path(root) / rel
        if before.get(rel) == sig or f.is_symlink() or not f.is_file():
            continue
        try:
            if f.name.startswith(".tmp-") and f.name.endswith(".part"):
                bad[rel] = "a temporary file left behind"
            elif f.suffix == ".json":
                doc = json.loads(f.read_bytes().decode("utf-8"))
                if f.name == "manifest.json" and isinstance(doc, dict) and isinstance(doc.get("sha256"), dict):
                    for name, want in doc["sha256"].items():
                        if not (f.parent / name).is_file() or _sha(f.parent / name) != want:
                            bad[rel] = f"manifest: {name} does not match its checksum"
            elif f.suffix == ".safetensors":
                with open(f, "rb") as fh:
                    size = os.fstat(fh.fileno()).st_size
                    _, _, end = parse_safetensors_header(fh, size)
                if end != size:
                    bad[rel] = f"safetensors: header needs {end} bytes, file has {size}"
        except (ValueError, UnicodeDecodeError, RecursionError) as e:
            bad[rel] = f"does not parse ({str(e)[:100]})"
    return bad


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
                         "stderr": "", "victim_changed": False, "data_changed": False, "rss_mb": 0,
                         "component": component(cases[len(done)]["argv"]), "torn": [], "answer": "not checked: died"})
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
    expected directories changed, memory past RSS_BOUND_MB, a wrong answer, a torn file."""
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
        if r.get("answer", "").startswith("WRONG"):
            why.append("wrong answer: " + r["answer"][7:400])
        if r.get("torn"):
            why.append("torn files: " + "; ".join(r["torn"])[:400])
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
