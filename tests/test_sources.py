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
