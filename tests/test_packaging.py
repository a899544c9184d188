"""The set-up files agree with each other."""
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONDA_NAMES = {"pytorch-cpu": "torch"}


def _name(req: str) -> str:
    return re.split(r"[<>=!~ \[;]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def test_environment_yml_names_the_same_packages_as_pyproject():
    py = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    want = {_name(r) for r in py["dependencies"]} | {_name(r) for r in py["optional-dependencies"]["dev"]}
    got = set()
    text = (ROOT / "environment.yml").read_text()
    deps = text[text.index("dependencies:"):]
    for line in deps.splitlines():
        m = re.match(r"^\s*-\s+([A-Za-z0-9_.\-]+[^#]*)", line)
        if not m or line.strip().startswith("- pip:") or "-e ." in line:
            continue
        n = _name(m.group(1))
        if n in ("python", "pip"):
            continue
        got.add(CONDA_NAMES.get(n, n))
    assert got == want, f"only in environment.yml: {got - want}; only in pyproject: {want - got}"


def test_ci_runs_the_readme_test_command_verbatim():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    cmds = re.findall(r"^\s*(\./workbook \w+)\s*$", readme, flags=re.M)
    assert "./workbook test" in cmds and "./workbook run" in cmds
    assert "./workbook test" in ci.splitlines()
