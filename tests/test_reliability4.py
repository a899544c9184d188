"""Reliability 4 (issue 60): running out of memory or threads is one clear line, `--threads` means the C
kernel's threads, `models` stays cheap, and the fuzz's wrong answer settled. Each test failed on the code
before its fix.

The limits are set in real `python -m lessonkit` processes (RLIMIT_AS, RLIMIT_NPROC), as the fuzz layer sets
them (tests/fuzz_run.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# `python -c LIMITED AS_MB NPROC ARGS...`: lessonkit's main under an address-space limit (MB, 0: none) and a
# limit on the processes and threads of its user (RLIMIT_NPROC, 0: none). The kernel ignores RLIMIT_NPROC for
# root, so a root test runs the command as `nobody`, whose threads are then this process's own.
LIMITED = ("import os, resource, runpy, sys\n"
           "as_mb, nproc = int(sys.argv.pop(1)), int(sys.argv.pop(1))\n"
           "if as_mb: resource.setrlimit(resource.RLIMIT_AS, (as_mb << 20, as_mb << 20))\n"
           "if nproc:\n"
           "    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))\n"
           "    if os.geteuid() == 0: os.setgroups([]); os.setgid(65534); os.setuid(65534)\n"
           "sys.argv[0] = 'lessonkit'\n"
           "runpy.run_module('lessonkit', run_name='__main__', alter_sys=True)\n")


def run_limited(args: list, home: Path, *, as_mb: int = 0, nproc: int = 0, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "LESSONKIT_HOME": str(home), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT),
           "PYTHONWARNINGS": "ignore::DeprecationWarning"}
    return subprocess.run([sys.executable, "-c", LIMITED, str(as_mb), str(nproc), *args], capture_output=True,
                          text=True, env=env, cwd=home.parent, timeout=timeout)


def one_line_exit_2(r: subprocess.CompletedProcess, *needles) -> str:
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("lessonkit: error:")]
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(errors) == 1, (r.returncode, r.stderr[-3000:])
    for n in needles:
        assert n in errors[0], errors[0]
    return errors[0]


def damaged_home(tmp_path: Path) -> Path:
    home = tmp_path / "home" / "lessonkit"
    home.mkdir(parents=True)
    (home / "verified.json").write_bytes(b'{"/x": [' * 5000)          # a damaged hash memo
    return home


# ---- item 3: `models` lists from configs and hashes, builds nothing -----------------------------------------------
def test_models_with_a_damaged_memo_under_an_address_space_limit_builds_nothing(tmp_path):
    """A fresh home and a damaged memo under 1,000 MB of address space: the list, exit 0 (it built the merged
    and assembled models there, a 113 MB float32 output layer among them, and ended in a traceback)."""
    home = damaged_home(tmp_path)
    r = run_limited(["models", "--json"], home, as_mb=1000)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    rows = json.loads(r.stdout)
    from lessonkit.models.listing import list_models
    assert [m["name"] for m in rows] == list_models() and all("error" not in m for m in rows), rows
    assert not (home / "models").exists() or not any((home / "models").iterdir()), list((home / "models").iterdir())
    assert {m["name"]: m["params"] for m in rows}["smollm2-135m-judge"] == {m["name"]: m["params"] for m in rows}["smollm2-135m"]


def test_models_imports_no_torch():
    """Listing reads configs: torch's import alone is most of the command's memory and time."""
    code = ("import sys, io, contextlib; from lessonkit.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()): assert main(['models']) == 0\n"
            "print('torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stdout + r.stderr[-2000:]


def test_the_gguf_header_gives_the_config_of_a_conversion():
    """listing reads SmolLM2's config from the GGUF header with struct; gguf.GGUFReader's metadata gives the same."""
    from lessonkit.engine.config import ModelConfig
    from lessonkit.models.gguf_loader import _open, hf_config_from_metadata, read_metadata, smollm2_gguf_path
    from lessonkit.models.listing import _gguf_config
    path = smollm2_gguf_path()
    reader = _open(path)
    tied = not any(t.name == "output.weight" for t in reader.tensors)
    assert _gguf_config(path) == ModelConfig.from_hf(hf_config_from_metadata(read_metadata(reader), tied=tied, path=path))
