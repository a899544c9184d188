"""The C kernel's names, checked against the Python side and against the C sources themselves (issue 61).

The bytes inside a strip-block are named once, in csrc/format.h's structs (block_q41, block_q80 and the int
layouts' twins); lessonkit/engine/packed_layout.py mirrors their offsets in BLOCK_LAYOUT. A C program compiled
here prints offsetof() and sizeof() of every field, and the two must agree; the same for rk_forward's two inputs,
rowkernel.h's struct rk_model and struct rk_batch, against kernel_library's ctypes mirrors (RkModel, RkBatch). The
sources are then read for what the names replace: a literal byte offset inside a block (`blk + 32`,
`blk[64 + ...]`), the path word's ISA compared with a number, a `.c` file included by another."""
from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lessonkit.engine import packed_layout as qb

ROOT = Path(__file__).resolve().parents[1]
CSRC = ROOT / "csrc"


def c_compiler() -> list[str] | None:
    """This machine's C compiler, else zig's (the one the shipped binaries are built with)."""
    for cc in ("cc", "gcc", "clang"):
        if shutil.which(cc):
            return [cc]
    try:
        import ziglang  # noqa: F401
        return [sys.executable, "-m", "ziglang", "cc"]
    except ImportError:
        return None


def c_sources() -> dict[str, str]:
    """Every C file of csrc/ with its comments blanked (a comment may quote an offset; code may not)."""
    out = {}
    for path in sorted(CSRC.glob("*.[ch]")):
        text = path.read_text(encoding="utf-8")
        out[path.name] = re.sub(r"/\*.*?\*/|//[^\n]*", lambda m: re.sub(r"[^\n]", " ", m.group()), text, flags=re.S)
    return out


def printed(tmp_path: Path, header: str, lines: list[str]) -> list[str]:
    """The lines a C program prints that includes csrc/`header` and runs the printf `lines` (skips the test
    without a C compiler)."""
    cc = c_compiler()
    if cc is None:
        pytest.skip("no C compiler (cc, gcc, clang or ziglang)")
    src = tmp_path / "print.c"
    src.write_text(f'#include <stdio.h>\n#include <stddef.h>\n#include "{header}"\nint main(void) {{\n'
                   + "".join(lines) + "    return 0;\n}\n")
    exe = tmp_path / "print"
    subprocess.run(cc + ["-std=c11", "-Wall", "-Werror", f"-I{CSRC}", str(src), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split("\n")
    return [line for line in out if line]


def test_block_layout_equals_format_h_structs(tmp_path):
    """BLOCK_LAYOUT's offsets and sizes are what a C compiler makes of format.h's structs."""
    lines = []
    for struct, fields in qb.BLOCK_LAYOUT.items():
        for field in fields:
            what = f"sizeof({struct})" if field == "size" else f"offsetof({struct}, {field})"
            lines.append(f'    printf("{struct} {field} %d\\n", (int)({what}));\n')
    out = printed(tmp_path, "format.h", lines)
    got: dict[str, dict[str, int]] = {}
    for line in out:
        struct, field, value = line.split()
        got.setdefault(struct, {})[field] = int(value)
    assert got == qb.BLOCK_LAYOUT
    assert {k: v["size"] for k, v in qb.FIELDS.items()} == qb.STRIP_BLOCK_BYTES


# a pointer into a block (or a block's bytes) plus a literal offset, or a literal offset plus a stride, or a
# strip-block's size written as a number
LITERAL_OFFSET = re.compile(r"\b(?:blk|wp|ws|src|dst|s|o|p|q)\s*(?:\+|\[)\s*(?:16|32|48|64)\b(?!\s*\*)"
                            r"|\b(?:16|32|48|64)\s*\+\s*(?:STRIP|IGROUP)\b|Q(?:41|80)_BLOCK\s*\+\s*\d"
                            r"|\b(?:320|544)\b|memcpy\([^;]*,\s*(?:32|64)\)|\?\s*(?:32|64)\s*:\s*(?:16|32)\b")


def test_no_literal_block_offsets_in_c():
    """Every byte inside a block is read through format.h's fields, never at a number."""
    found = [f"{name}:{text[:m.start()].count(chr(10)) + 1}: {m.group()}"
             for name, text in c_sources().items() if name != "format.h"
             for m in LITERAL_OFFSET.finditer(text)]
    assert found == []


# the path word's ISA compared with a number, or the old names of the path word and its ISA
ISA_BY_NUMBER = re.compile(r"PATH_ISA\s*\)\s*==\s*\d|\b(?:avx2|isa|path)\s*==\s*\d|\buse_avx2\b|(?:->|\.)avx2\b"
                           r"|\bint\s+avx2\b")


def test_the_isa_is_named_in_c():
    """enum rk_isa (rowkernel.h) is the ISA's one name: no `== 2` on the path word, no `avx2` for the path."""
    header = (CSRC / "rowkernel.h").read_text(encoding="utf-8")
    assert re.search(r"enum rk_isa\s*\{\s*PATH_PORTABLE = 0, PATH_AVX2 = 1, PATH_AVX512 = 2\s*\}", header)
    found = [f"{name}:{text[:m.start()].count(chr(10)) + 1}: {m.group()}"
             for name, text in c_sources().items() for m in ISA_BY_NUMBER.finditer(text)]
    assert found == []


def test_the_kernel_is_units_that_include_no_c_file():
    """csrc/build_kernels.py compiles every unit on its own; a `#include "x.c"` would make two units one again."""
    sys.path.insert(0, str(CSRC))
    import build_kernels
    includes = {name: re.findall(r'#include\s+"([^"]+)"', text) for name, text in c_sources().items()}
    assert [(n, i) for n, inc in includes.items() for i in inc if i.endswith(".c")] == []
    assert sorted(build_kernels.UNITS) == sorted(n for n in includes if n.endswith(".c") and n != "kernel_check.c")
    assert set(build_kernels.SOURCES) == {n for n in includes if n != "kernel_check.c"}


def test_forward_structs_equal_rowkernel_h(tmp_path):
    """kernel_library's ctypes mirrors of struct rk_model and struct rk_batch (rk_forward's two inputs) have the
    field names, offsets and sizes a C compiler gives rowkernel.h's structs, and the same total size."""
    from lessonkit.engine import kernel_library as KL
    mirrors = {"rk_model": KL.RkModel, "rk_batch": KL.RkBatch}
    lines = []
    for struct, mirror in mirrors.items():
        lines.append(f'    printf("{struct} size %d %d\\n", 0, (int)sizeof(struct {struct}));\n')
        for name, _ in mirror._fields_:
            lines.append(f'    printf("{struct} {name} %d %d\\n", (int)offsetof(struct {struct}, {name}), '
                         f'(int)sizeof(((struct {struct} *)0)->{name}));\n')
    out = printed(tmp_path, "rowkernel.h", lines)
    got = {tuple(line.split()[:2]): tuple(map(int, line.split()[2:])) for line in out}
    want = {}
    for struct, mirror in mirrors.items():
        want[(struct, "size")] = (0, ctypes.sizeof(mirror))
        for name, ctype in mirror._fields_:
            want[(struct, name)] = (getattr(mirror, name).offset, ctypes.sizeof(ctype))
    assert got == want
    header = (CSRC / "rowkernel.h").read_text(encoding="utf-8")
    for struct, mirror in mirrors.items():          # every field of the header's struct is mirrored, in order
        body = re.search(r"struct %s \{(.*?)\n\};" % struct, header, re.S).group(1)
        body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
        names = [n for decl in body.split(";") for n in re.findall(r"\**(\w+)\s*(?:,|$)", decl.strip())]
        assert names == [n for n, _ in mirror._fields_], struct
