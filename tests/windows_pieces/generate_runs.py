"""tiny-moe through the command line, three times in one process: plain, then with a prefix cache
(cold: saved) and again (warm: restored), each streaming experts under a small budget. Prints one
JSON object {run: the command's --json output}. Usage: generate_runs.py CACHE_DIR BUDGET_MB"""
import contextlib
import io
import json
import sys

from lessonkit.cli import main

PROMPT = "The prefix cache restores the state of a long prompt from disk, and the expert store"


def run(*extra: str) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["generate", "--model", "tiny-moe", "--prompt", PROMPT, "--max-new-tokens", "24",
                   "--expert-budget-mb", sys.argv[2], "--threads", "1", "--json", *extra])
    assert rc == 0, rc
    return json.loads(out.getvalue())


if __name__ == "__main__":
    runs = {"plain": run(), "cold": run("--prefix-cache", sys.argv[1]), "warm": run("--prefix-cache", sys.argv[1])}
    print(json.dumps(runs))
