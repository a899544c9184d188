"""The shape of the house: rooms that say what they hold, dependencies pointing one way,
errors, files <- engine <- models <- workloads <- techniques <- training, drafter_registry, stack <- measure <- lessons <-
report, bench <- commands (doctor, sweep) <- cli, with no import cycles, short modules and short functions. Imports are
read with `ast` (every import counts, also one inside a function), so nothing here imports the package."""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "lessonkit"
TECHNIQUES = ("speculative", "mtp", "feature_head", "grammar", "prefix_cache", "semcache", "gap")
LAYER = {"__init__": 0, "errors": 0, "files": 0, "engine": 1, "models": 2, "workloads": 3,
         **{t: 4 for t in TECHNIQUES}, "training": 5, "drafter_registry": 5, "stack": 5, "measure": 6, "lessons": 7, "exercises": 7,
         "report": 8, "bench": 8, "commands": 9, "doctor": 9, "sweep": 9, "cli": 10, "__main__": 11}
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60
DRAWING = ("matplotlib", "ipywidgets")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def _unit(module: str) -> str:
    """The part of the house a module belongs to: lessonkit.engine.model -> engine, lessonkit -> __init__."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _resolve(name: str) -> str | None:
    """The lessonkit module an imported dotted name refers to (a module, or the module defining the name)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str) -> list[tuple[str, int]]:
    """(imported top-level package or lessonkit module, line) for every import statement in `module`."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            out += [(f"{base}.{a.name}", node.lineno) for a in node.names]
    return out


def _graph() -> dict[str, set[str]]:
    graph = {m: set() for m in MODULES}
    for m in MODULES:
        for name, _ in _imports(m):
            if name.split(".")[0] == "lessonkit":
                target = _resolve(name)
                if target and target != m:
                    graph[m].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_every_module_has_a_place_in_the_house():
    assert {_unit(m) for m in MODULES} <= set(LAYER), sorted({_unit(m) for m in MODULES} - set(LAYER))


def test_dependencies_point_one_way():
    """The engine imports only the engine; techniques import no stack, lesson, benchmark or CLI code; and so on."""
    wrong = []
    for m, deps in _graph().items():
        for d in deps:
            if LAYER[_unit(d)] > LAYER[_unit(m)]:
                wrong.append(f"{m} imports {d}")
    assert not wrong, "\n".join(sorted(wrong))


def test_no_import_cycles_between_modules_or_packages():
    graph = _graph()
    assert _cycles(graph) == []
    units = {}
    for m, deps in graph.items():
        units.setdefault(_unit(m), set()).update(_unit(d) for d in deps if _unit(d) != _unit(m))
    assert _cycles(units) == []


def test_only_the_lessons_draw():
    drawing = [f"{m}:{line} imports {name}" for m in MODULES if _unit(m) != "lessons"
               for name, line in _imports(m) if name.split(".")[0] in DRAWING]
    assert not drawing, "\n".join(drawing)


def test_modules_and_functions_are_short():
    long = []
    for m, path in MODULES.items():
        text = path.read_text()
        if len(text.splitlines()) > MAX_MODULE_LINES:
            long.append(f"{m}: {len(text.splitlines())} lines")
        if _unit(m) == "exercises":
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{m}.{node.name}: {n} lines")
    assert not long, "\n".join(long)


NOTEBOOKS = sorted((ROOT / "notebooks").rglob("*.ipynb"))


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT / "notebooks")))
def test_notebooks_import_lessons_and_techniques_that_exist(nb):
    """A notebook imports existing lessonkit modules and names, never the CLI or a benchmark."""
    bad = []
    from IPython.core.inputtransformer2 import TransformerManager
    for cell in json.loads(nb.read_text(encoding="utf-8"))["cells"]:
        if cell["cell_type"] != "code":
            continue
        python = TransformerManager().transform_cell("".join(cell["source"]))   # %pip and !cmd as IPython runs them
        for node in ast.walk(ast.parse(python)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "lessonkit":
                names = [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name.split(".")[0] == "lessonkit"]
            else:
                continue
            for name in names:
                target = _resolve(name)
                if target is None or _unit(target) in ("bench", "commands", "cli"):
                    bad.append(name)
                elif target != name and name.rpartition(".")[2] not in _defined_names(target):
                    bad.append(name)
    assert not bad, bad


def _defined_names(module: str) -> set[str]:
    tree = ast.parse(MODULES[module].read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


NO_DRAWING = """
import importlib, pkgutil, sys
class NoDrawing:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {drawing!r}:
            raise ImportError(f"{{name}} is blocked: this code must not load it")
sys.meta_path.insert(0, NoDrawing())
"""
BENCH_MODULES = """
import lessonkit.bench, lessonkit.measure
mods = [m.name for p in (lessonkit.bench, lessonkit.measure) for m in pkgutil.iter_modules(p.__path__, p.__name__ + ".")]
"""
IMPORT_ALL = """
for name in mods:
    importlib.import_module(name)
print(len(mods))
"""


def _import_without_drawing(modules: str):
    """Run `modules` (code that sets `mods`, names of modules) then import each, with matplotlib and ipywidgets
    blocked, in a fresh interpreter."""
    import subprocess
    import sys
    code = NO_DRAWING.format(drawing=set(DRAWING)) + modules + IMPORT_ALL
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)


def test_benchmarks_import_without_matplotlib():
    """Every bench and measure module imports with matplotlib and ipywidgets blocked: `lessonkit bench` needs
    neither (the ast ladder above sees direct imports; this sees what each module loads, transitively)."""
    r = _import_without_drawing(BENCH_MODULES)
    assert r.returncode == 0, r.stderr[-2000:]
    assert int(r.stdout.split()[-1]) >= len([m for m in MODULES if _unit(m) in ("bench", "measure")]) - 2


DRAW_NOTHING = ("cmd_train", "cmd_stack_run")       # `lessonkit train`, `lessonkit stack run`


def _handler_imports(handlers) -> list[str]:
    """The lessonkit modules that these handlers of lessonkit.commands import when they run, with those of the
    handlers they call (cmd_train calls cmd_train_cut and cmd_train_judge) and the module's own."""
    tree = ast.parse(MODULES["lessonkit.commands"].read_text())
    defs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    nodes, todo, seen = list(tree.body), list(handlers), set()
    while todo:
        name = todo.pop()
        seen.add(name)
        nodes += list(ast.walk(defs[name]))
        todo += [n.func.id for n in ast.walk(defs[name]) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                 and n.func.id in defs and n.func.id not in seen]
    names = [a.name for n in nodes if isinstance(n, ast.Import) for a in n.names]
    names += [n.module for n in nodes if isinstance(n, ast.ImportFrom) and n.module]
    return sorted({n for n in names if n.split(".")[0] == "lessonkit"})


def test_train_and_stack_run_import_without_matplotlib():
    """`lessonkit train` and `lessonkit stack run` draw nothing: every module their handlers import, with all it
    loads, imports with matplotlib and ipywidgets blocked (as the benchmarks' modules do above)."""
    mods = _handler_imports(DRAW_NOTHING)
    assert "lessonkit.training.tiny_models" in mods, mods
    r = _import_without_drawing(f"mods = {mods!r}\n")
    assert r.returncode == 0, r.stderr[-2000:]


def test_bench_modules_are_named_after_their_commands():
    """`lessonkit bench NAME` runs lessonkit/bench/bench_NAME.py (a dash as an underscore), so no bench module
    shares its file name with a module of another room (bench/engine.py beside measure/engine.py, until issue 61)."""
    from lessonkit.bench import BENCHES
    assert BENCHES == {name: f"lessonkit.bench.bench_{name.replace('-', '_')}" for name in BENCHES}
    files = {m.rsplit(".", 1)[-1] for m in MODULES if _unit(m) == "bench" and m != "lessonkit.bench"}
    elsewhere = {m.rsplit(".", 1)[-1] for m in MODULES if _unit(m) != "bench"}
    assert not files & elsewhere, sorted(files & elsewhere)


def test_lessons_re_export_nothing():
    """A lesson module imports from lessonkit only what it uses itself: a notebook takes its measurements from
    lessonkit.measure, its techniques from their rooms, not through a lesson."""
    unused = []
    for m, path in MODULES.items():
        if _unit(m) != "lessons":
            continue
        tree = ast.parse(path.read_text())
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        unused += [f"{m}:{node.lineno} {a.asname or a.name}" for node in tree.body
                   if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lessonkit")
                   for a in node.names if (a.asname or a.name) not in used]
    assert not unused, "\n".join(unused)


def test_only_the_resolver_uses___file__():
    """One resolver finds the workbook's files (lessonkit.files.resources: a wheel's copy or a clone); no other
    module finds them, or its own package data, through its own `__file__`."""
    users = [m for m, path in MODULES.items() if m != "lessonkit.files.resources"
             and any(isinstance(n, ast.Name) and n.id == "__file__" for n in ast.walk(ast.parse(path.read_text())))]
    assert not users, users


def test_only_engine_threads_sets_torchs_thread_count():
    """--threads means the C kernel's threads; torch's count is set from it, or pinned for a while, in
    lessonkit.engine.threads only (use_threads, pin_torch_threads, torch_threads)."""
    setters = [f"{m}:{n.lineno}" for m, path in MODULES.items() if m != "lessonkit.engine.threads"
               for n in ast.walk(ast.parse(path.read_text()))
               if isinstance(n, ast.Attribute) and n.attr == "set_num_threads"]
    assert not setters, setters


def _environment_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of every read of a LESSONKIT_* variable: os.environ[NAME] loaded, os.environ.get(NAME),
    os.getenv(NAME)."""
    out = []
    for node in ast.walk(tree):
        loaded = isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load)
        if loaded and ast.unparse(node.value) == "os.environ":
            key = node.slice
        elif isinstance(node, ast.Call) and ast.unparse(node.func) in ("os.environ.get", "os.getenv") and node.args:
            key = node.args[0]
        else:
            continue
        if isinstance(key, ast.Constant) and str(key.value).startswith("LESSONKIT_"):
            out.append((node.lineno, key.value))
    return out


def test_only_engine_settings_reads_the_settings_variables():
    """The run's settings (kernel path, numerics, threads, weights, forward) are read from the environment in
    lessonkit.engine.settings.from_env only. LESSONKIT_HOME, where the cache lives, is no run setting: the files
    room below the engine reads it (lessonkit.files.resources)."""
    reads = [f"{m}:{line} reads {name}" for m, path in MODULES.items() if m != "lessonkit.engine.settings"
             for line, name in _environment_reads(ast.parse(path.read_text()))
             if (m, name) != ("lessonkit.files.resources", "LESSONKIT_HOME")]
    assert not reads, "\n".join(reads)
    seen = _environment_reads(ast.parse('os.environ.get("LESSONKIT_KERNEL")\nos.environ["LESSONKIT_THREADS"]\n'
                                        'os.environ["LESSONKIT_NUMERICS"] = "int8"'))
    assert [name for _, name in seen] == ["LESSONKIT_KERNEL", "LESSONKIT_THREADS"]     # a write is no read


def _environment_writes(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of every write of a LESSONKIT_* variable: os.environ[NAME] = ..., os.environ.setdefault(NAME),
    os.putenv(NAME)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store) and ast.unparse(node.value) == "os.environ":
            key = node.slice
        elif isinstance(node, ast.Call) and ast.unparse(node.func) in ("os.environ.setdefault", "os.putenv") and node.args:
            key = node.args[0]
        else:
            continue
        if isinstance(key, ast.Constant) and str(key.value).startswith("LESSONKIT_") or ast.unparse(key).startswith("settings.ENV"):
            out.append((node.lineno, ast.unparse(key)))
    return out


def test_no_module_hands_a_setting_on_through_the_environment():
    """A notebook gets the run's settings as one papermill parameter (SETTINGS, engine.active.adopt), a command
    through its options: nothing in the package writes a LESSONKIT_* variable for a child process to read."""
    writes = [f"{m}:{line} writes {name}" for m, path in MODULES.items()
              for line, name in _environment_writes(ast.parse(path.read_text()))]
    assert not writes, "\n".join(writes)
    seen = _environment_writes(ast.parse('os.environ["LESSONKIT_NUMERICS"] = "int8"\nos.environ[settings.ENV["kernel"]] = x\n'
                                         'os.environ.get("LESSONKIT_KERNEL")\nos.environ["HF_HUB_OFFLINE"] = "1"'))
    assert [line for line, _ in seen] == [1, 2]                          # a read, or another variable, is no write


# engine's context managers that change no run setting: a kernel build swapped in (a build, not a setting) and
# torch's own thread count pinned while timing (torch's, not the kernel's)
NOT_SETTINGS = {"lessonkit.engine.kernel": {"use_library"}, "lessonkit.engine.threads": {"torch_threads"}}


def test_settings_change_for_a_block_through_engine_active_use_only():
    """One context manager changes the run's settings for a block, lessonkit.engine.active.use; the engine
    keeps no per-setting one (a kernel.using beside it)."""
    found = [f"{m}.{n.name}" for m, path in MODULES.items() if m.startswith("lessonkit.engine.")
             and m != "lessonkit.engine.active" for n in ast.walk(ast.parse(path.read_text()))
             if isinstance(n, ast.FunctionDef) and "contextmanager" in " ".join(map(ast.unparse, n.decorator_list))
             and n.name not in NOT_SETTINGS.get(m, ())]
    assert not found, found


READS_A_FILE = ("read_csv(", "read_json(", "read_parquet(", "open(", "json.load(", "np.load(", ".read_text(",
                ".read_bytes(", "safe_open(", "load_file(")


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT / "notebooks")))
def test_no_notebook_reads_a_file_itself(nb):
    """The package reads the workbook's files (and names the file when one is missing or corrupt); a notebook
    calls it. Code written as a string for the reader (a sample text) does not count."""
    reads = []
    for cell in json.loads(nb.read_text(encoding="utf-8"))["cells"]:
        if cell["cell_type"] != "code":
            continue
        from IPython.core.inputtransformer2 import TransformerManager
        tree = ast.parse(TransformerManager().transform_cell("".join(cell["source"])))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                call = ast.unparse(node.func) + "("
                reads += [call for r in READS_A_FILE if call.endswith(r) or call == r]
    assert not reads, reads


def test_the_path_word_is_not_called_avx2_in_python():
    """rowkernel.h names the path word's ISA `enum rk_isa` (issue 61 item 3): Python says `path` / `isa`, never
    `avx2` / `use_avx2` for it, so the old name cannot come back (the AVX2 ISA itself, PATH_AVX2, is fine)."""
    old = re.compile(r"\buse_avx2\b|\.avx2\b")
    found = [f"{p.relative_to(ROOT)}:{i}" for p in [*MODULES.values(), *sorted((ROOT / "tests").glob("*.py"))]
             if p.name != "test_layout.py"
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if old.search(line)]
    assert found == []
