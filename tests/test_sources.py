"""Every quoted figure is sourced inside the repository.

The lessons, docs, model cards and code cite primary sources (and may link to docs/sources.md);
nothing the repository tracks may point at a file outside it: a project-internal notes file, a
shared folder of the machine it was written on, or an absolute path of some machine.
"""
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
THIS = "tests/test_sources.py"

# Files a reader reads: prose, notebooks, code, configuration. Not .gitignore and the like, whose
# "/tmp/" is a pattern, not a reference.
TEXT_SUFFIXES = {".md", ".txt", ".ipynb", ".py", ".toml", ".yml", ".yaml", ".cfg", ".gbnf"}

OUTSIDE_REFERENCES = [
    ("a shared folder outside the repository", re.compile(r"(?<![\w.-])shared/")),
    ("a notes file that is not in the repository", re.compile(r"\bfacts\.md\b")),
    ("the notes file, by description", re.compile(r"\breference facts\b", re.I)),
    # An absolute path of a machine: /work/..., /home/..., /root/..., /tmp/..., /Users/..., /mnt/...
    # Not inside a URL or a longer path (https://example.org/home/ has a word character before it).
    ("an absolute path of a machine",
     re.compile(r"(?<![\w.~/:-])/(?:work|home|root|tmp|Users|mnt|scratch)/[\w.-]")),
]


def tracked_text_files() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: no list of tracked files")
    names = [n for n in out.stdout.decode().split("\0") if n]
    return [n for n in names if Path(n).suffix in TEXT_SUFFIXES and n != THIS]


def test_the_source_list_exists_and_is_linked():
    sources = (ROOT / "docs" / "sources.md").read_text()
    for needle in ("github.com/JustVugg/colibri/issues/153", "github.com/JustVugg/colibri/pull/397",
                   "github.com/JustVugg/colibri/pull/148", "github.com/JustVugg/colibri/pull/192",
                   "github.com/JustVugg/colibri/issues/146", "transformers/issues/39421",
                   "hydra/pull/945", "epoch.ai"):
        assert needle in sources, f"docs/sources.md does not cite {needle}"
    assert "docs/sources.md" in (ROOT / "README.md").read_text()


def test_no_tracked_file_refers_to_a_path_outside_the_repository():
    problems = []
    for name in tracked_text_files():
        path = ROOT / name
        if not path.is_file():          # deleted in the work tree, not yet committed
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for lineno, line in enumerate(text.splitlines(), 1):
            for what, pattern in OUTSIDE_REFERENCES:
                m = pattern.search(line)
                if m:
                    problems.append(f"{name}:{lineno}: {what}: ...{line[max(0, m.start() - 40):m.end() + 40].strip()}...")
    assert not problems, ("cite the primary source (see docs/sources.md) instead of a file outside "
                          "the repository:\n" + "\n".join(problems))


@pytest.mark.parametrize("line, bad", [
    ("(quoted from `facts.md`)", True),
    ("sources in `shared/reference/facts.md`", True),
    ("copy it from shared/data/epoch/", True),
    ("(reference facts, \"Other anchors\")", True),
    ("in `/work/shared/reference/facts.md`", True),
    ("see /home/alice/notes.txt", True),
    ("tempfile.mkdtemp() gives a folder under the system's temporary directory", False),
    ("https://github.com/JustVugg/colibri/issues/153", False),
    ("cached under ~/.cache/lessonkit", False),
    ("a shared CPU, shared cores, the project's shared data", False),
])
def test_the_patterns_flag_references_and_nothing_else(line, bad):
    assert any(p.search(line) for _, p in OUTSIDE_REFERENCES) == bad


# ---- every sentence true of the run it sits in -------------------------------------------------------
# Sentences that stated a run's result in fixed words, and could be false in another run. Each
# notebook now prints the sentence from its own numbers (a code cell that starts with RUN_WORDS) or
# states the condition under which it holds. This test executes nothing: it reads the markdown.
FIXED_SENTENCES = {
    "01_speculative.ipynb": ["The oracle sits near 0.7 everywhere", "as dialled.",
                             "measured curves, tracks the measurement",
                             "and the cells marked\n*loses* appear", "*loses* appear"],
    "02_mtp.ipynb": ["Records (NDJSON) are the most predictable text", "30-60%"],
    "05_semantic_cache.ipynb": ["so the probation audits take back most of what the hits save"],
    "07_stack.ipynb": ["as smollm2-135m does with this prompt", "tiny-moe answers with an empty line"],
}
RUN_WORDS = "# In words, from this run's numbers"
PRINTED_CELLS = {"01_speculative.ipynb": 3, "02_mtp.ipynb": 1, "05_semantic_cache.ipynb": 1, "07_stack.ipynb": 1}


def _cells(name, kind):
    import json
    nb = json.loads((ROOT / "notebooks" / name).read_text())
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == kind]


@pytest.mark.parametrize("name", sorted(FIXED_SENTENCES))
def test_no_run_result_is_typed_into_the_markdown(name):
    markdown = "\n".join(_cells(name, "markdown"))
    flat = " ".join(markdown.split())
    left = [s for s in FIXED_SENTENCES[name] if " ".join(s.split()) in flat]
    assert not left, f"{name}: fixed sentences about a run's result are back: {left}"


@pytest.mark.parametrize("name", sorted(PRINTED_CELLS))
def test_the_notebook_prints_those_sentences_from_its_numbers(name):
    cells = [c for c in _cells(name, "code") if c.startswith(RUN_WORDS)]
    assert len(cells) >= PRINTED_CELLS[name] and all("print(" in c for c in cells)


def test_the_known_misquotes_are_gone():
    """The figures issue 17 found misquoted stay corrected everywhere but docs/sources.md."""
    bad = {"transformers issues 30042": "30042 is a cache_position bug (PR 30068); cite issue 39421",
           "stood for 18 months": "the notebook computes the MMLU duration from the data",
           "30-60% reported": "the sources report 39-59% and 43-57%",
           "\"resumed 1219 tokens in 0.2 s\" | Colibri": "a bug report, not a speed figure"}
    problems = []
    for name in tracked_text_files():
        if name == "docs/sources.md" or not (ROOT / name).is_file():
            continue
        raw = (ROOT / name).read_text(encoding="utf-8", errors="replace")
        if name.endswith(".ipynb"):
            import json
            raw = "\n".join("".join(c["source"]) for c in json.loads(raw)["cells"])
        text = " ".join(raw.split())
        problems += [f"{name}: {needle!r} ({why})" for needle, why in bad.items() if needle in text]
    assert not problems, "\n".join(problems)
