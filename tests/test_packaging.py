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


def test_ci_runs_the_readme_test_commands_verbatim_one_after_the_other():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    cmds = re.findall(r"^\s*(\./workbook \w+(?: --platforms)?)\s*$", readme, flags=re.M)
    assert {"./workbook test", "./workbook test --platforms", "./workbook run"} <= set(cmds), cmds
    runs = [line.split(" ||")[0] for line in ci if line.startswith("./workbook ")]
    assert runs == ["./workbook test", "./workbook test --platforms"], runs


def test_the_default_test_run_leaves_the_platform_tests_to_their_own_command():
    """`./workbook test` deselects every test marked platforms (and the slow modules carry the mark);
    `./workbook test --platforms` selects exactly them."""
    bash = (ROOT / "workbook").read_text(encoding="utf-8")
    runs = re.findall(r"python -m pytest (.*?)(?:\|\||;|$)", bash, flags=re.M)
    suite = [r for r in runs if '"$@"' not in r]
    assert suite and all('and not platforms"' in r for r in suite), runs
    assert any("-m platforms " in r and '"$@"' in r for r in runs), runs
    for name in ("test_platforms_install", "test_platforms_kernel", "test_kernel_tsan"):
        assert "pytestmark = pytest.mark.platforms" in (ROOT / "tests" / f"{name}.py").read_text(encoding="utf-8"), name


def test_workbook_py_sets_up_what_workbook_does():
    """Windows' `py workbook.py run|test` installs the same things as ./workbook, and runs the same jobs."""
    import subprocess
    import sys
    bash = (ROOT / "workbook").read_text(encoding="utf-8")
    shown = subprocess.run([sys.executable, str(ROOT / "workbook.py"), "test", "--print"], capture_output=True,
                           text=True, encoding="utf-8", check=True).stdout
    for step in ('"torch==2.13.0"', '-e ".[dev]"', "lessonkit setup", "ipykernel install --sys-prefix --name python3",
                 '-n 2 --dist worksteal -m "not serial and not platforms" --durations=15',
                 '-m "serial and not platforms"'):
        assert step in bash, step
        assert step.replace('"', "") in shown.replace("-m lessonkit setup", "lessonkit setup"), step
    platforms = subprocess.run([sys.executable, str(ROOT / "workbook.py"), "test", "--platforms", "--print"],
                               capture_output=True, text=True, encoding="utf-8", check=True).stdout
    assert platforms.splitlines()[-1].endswith("-n 2 --dist worksteal -m platforms --durations=15")
    assert "-n 2 --dist worksteal -m platforms --durations=15" in bash
    long = subprocess.run([sys.executable, str(ROOT / "workbook.py"), "test", "--long", "--print"],
                          capture_output=True, text=True, encoding="utf-8", check=True).stdout
    assert long.splitlines()[-1].endswith("-m pytest -q tests/test_fuzz.py")
    assert "LESSONKIT_FUZZ=long python -m pytest -q tests/test_fuzz.py" in bash
    run = subprocess.run([sys.executable, str(ROOT / "workbook.py"), "run", "--smoke", "--print"], capture_output=True,
                         text=True, encoding="utf-8", check=True).stdout
    assert run.splitlines()[-1].endswith("-m lessonkit run --smoke")


def test_the_sdist_manifest_holds_what_the_wheel_copies():
    """setup.py copies WORKBOOK_PARTS into the wheel: the sdist (MANIFEST.in) must carry each of them, and
    setup.py's list must be the resolver's."""
    from lessonkit.files.resources import WORKBOOK_PARTS
    manifest = (ROOT / "MANIFEST.in").read_text(encoding="utf-8")
    setup_py = (ROOT / "setup.py").read_text(encoding="utf-8")
    import ast
    assigned = [n.value for n in ast.parse(setup_py).body if isinstance(n, ast.Assign)
                and getattr(n.targets[0], "id", "") == "WORKBOOK_PARTS"]
    assert assigned and ast.literal_eval(assigned[0]) == WORKBOOK_PARTS
    for part in WORKBOOK_PARTS:
        assert f"graft {part}\n" in manifest, part


def test_readme_has_a_colab_link_per_lesson_on_the_published_repository():
    repo = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["urls"]["Repository"]
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    slug = repo.split("github.com/")[1]
    linked = set(re.findall(rf"colab\.research\.google\.com/github/{re.escape(slug)}/blob/main/notebooks/([^)\s]+)", readme))
    from lessonkit.report.runner import lesson_notebooks
    lessons = {p.name for p in lesson_notebooks(ROOT / "notebooks")}          # every lesson of the main job, 01b too
    assert linked == lessons, f"links without a notebook: {linked - lessons}; notebooks without a link: {lessons - linked}"


def test_the_shipped_kernel_binaries_name_no_path_of_the_build_machine():
    """A binary's debug map or build id must not carry the builder's folders (a student has none of them)."""
    for lib in sorted((ROOT / "lessonkit" / "engine" / "kernels").glob("rowkernel-*")):
        data = lib.read_bytes()
        for root in (b"/work/", b"/root/", b"/home/", b"/tmp/", b"/Users/", str(ROOT).encode()):
            assert root not in data, f"{lib.name} names {root.decode()}"
