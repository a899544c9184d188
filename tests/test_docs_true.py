"""The docs true again (issue 59, item 9): what the docs say about the shipped files is rendered from them, and
every docs banner that dates a figure names the CPU its runs were on.

    python tests/test_docs_true.py      # rewrite docs/kernel.md's table of binaries from manifest.json
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KERNEL_DOC = ROOT / "docs" / "kernel.md"
MANIFEST = ROOT / "lessonkit" / "engine" / "kernels" / "manifest.json"
BEGIN = "<!-- generated from lessonkit/engine/kernels/manifest.json by tests/test_docs_true.py: do not edit -->"
END = "<!-- end generated -->"
# what the table says beside a target, for a reader: facts about the target, not figures
NOTES = {"x86_64-linux-gnu.2.17": " (manylinux2014)", "x86_64-windows-gnu": " (needs only KERNEL32 and the UCRT)"}
ORDER = ("linux-x86_64", "linux-aarch64", "windows-x86_64", "windows-aarch64", "macos-x86_64", "macos-arm64")
BANNER_DOCS = ("stack.md", "speculative.md", "mtp.md", "grammar.md", "semcache.md")
CPU_WORDS = re.compile(r"AMD EPYC|Intel|Xeon|x86-64|CPU", re.I)


def binaries_table(manifest: dict) -> str:
    """The markdown table of the shipped kernel binaries: file, zig target, bytes, from the manifest."""
    def rank(name: str) -> int:
        return next((i for i, key in enumerate(ORDER) if key in name), len(ORDER))
    rows = ["| file (`lessonkit/engine/kernels/`) | zig target | bytes |", "|---|---|---|"]
    for name in sorted(manifest["binaries"], key=lambda n: (rank(n), n)):
        entry = manifest["binaries"][name]
        rows.append(f"| `{name}` | `{entry['target']}`{NOTES.get(entry['target'], '')} | {entry['bytes']:,} |")
    return "\n".join(rows)


def rendered(doc: str, manifest: dict) -> str:
    """`doc` with the part between the markers replaced by the table rendered from `manifest`."""
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{binaries_table(manifest)}\n{END}{tail}"


def _manifest() -> dict:
    return json.loads(MANIFEST.read_text(encoding="utf-8"))


def test_kernel_doc_binaries_are_the_manifests():
    doc = KERNEL_DOC.read_text(encoding="utf-8")
    assert doc.count(BEGIN) == 1 and doc.count(END) >= 1, "docs/kernel.md lost its generated table's markers"
    assert doc == rendered(doc, _manifest()), \
        "docs/kernel.md's binary sizes differ from manifest.json: run python tests/test_docs_true.py"


def test_the_render_sees_a_changed_size():
    """The check can fail: a manifest whose one binary grew by a byte renders another table."""
    manifest = _manifest()
    doc = rendered(KERNEL_DOC.read_text(encoding="utf-8"), manifest)
    name = sorted(manifest["binaries"])[0]
    manifest["binaries"][name]["bytes"] += 1
    assert rendered(doc, manifest) != doc
    assert f"{manifest['binaries'][name]['bytes']:,}" in binaries_table(manifest)


def _banners(text: str) -> list[str]:
    """Paragraph openings that date a record of runs: a bold or italic line carrying a date, or a dated heading
    (with the paragraph under it, where a record's conditions are usually written)."""
    date = re.compile(r"\b20\d\d-\d\d-\d\d\b|\b\d{1,2} Dec 20\d\d\b")
    out = []
    paras = re.split(r"\n\s*\n", text)
    for i, para in enumerate(paras):
        first = para.strip().split("\n")[0]
        if first.startswith("#") and date.search(first):
            under = paras[i + 1].strip().split("\n")[:3] if i + 1 < len(paras) else []
            out.append(" ".join([first, *under]))
        elif first.startswith("*") and date.search(first) and re.search(r"[Mm]easured|recorded|[Bb]ench|run", first):
            out.append(" ".join(para.strip().split("\n")[:3]))
    return out


@pytest.mark.parametrize("name", BANNER_DOCS)
def test_dated_banners_name_the_cpu(name):
    text = (ROOT / "docs" / name).read_text(encoding="utf-8")
    missing = [b[:140] for b in _banners(text) if not CPU_WORDS.search(b)]
    assert not missing, f"docs/{name}: banners that date a figure without naming its CPU: {missing}"


def test_the_banner_check_can_fail():
    assert _banners("*The figures in this section were recorded by runs up to 2026-12-01.*\n")
    assert not [b for b in _banners("*The figures in this section were recorded by runs up to 2026-12-01.*")
                if CPU_WORDS.search(b)]


if __name__ == "__main__":
    KERNEL_DOC.write_text(rendered(KERNEL_DOC.read_text(encoding="utf-8"), _manifest()), encoding="utf-8")
    sys.exit(0)
