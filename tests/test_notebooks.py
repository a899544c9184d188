"""Every notebook executes headlessly (papermill, SMOKE=True, INTERACTIVE=False): exercises (with their stubs)
and solutions here, one notebook per test; the lessons in the session's one SMOKE main job
(tests/smoke_build.py, checked in tests/test_runner.py), so that no lesson runs twice in a suite run. New
notebooks are covered automatically."""
import json
import tomllib
from pathlib import Path

import pytest

from lessonkit.report.runner import execute_notebook

ROOT = Path(__file__).resolve().parents[1]
LESSONS = sorted((ROOT / "notebooks").glob("*.ipynb"))
PRACTICE = sorted((ROOT / "notebooks" / "exercises").glob("*.ipynb")) + sorted((ROOT / "notebooks" / "solutions").glob("*.ipynb"))
NOTEBOOKS = LESSONS + PRACTICE
REPOSITORY = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["urls"]["Repository"]


def _rel(p):
    return str(p.relative_to(ROOT / "notebooks"))


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=_rel)
def test_notebook_conventions(nb):
    d = json.loads(nb.read_text(encoding="utf-8"))
    assert d["metadata"]["kernelspec"]["name"] == "python3"
    ids = [c.get("id") for c in d["cells"]]        # nbformat 4.5: every cell has an id, unique in its notebook
    assert None not in ids and len(set(ids)) == len(ids), f"cells without an id or with a repeated one: {ids}"
    code = [c for c in d["cells"] if c["cell_type"] == "code"]
    # first the parameters cell papermill injects after, then the Colab install cell (does nothing elsewhere)
    assert code and "parameters" in code[0].get("metadata", {}).get("tags", []), "first code cell must be tagged parameters"
    assert len(code) > 1 and "colab-setup" in code[1].get("metadata", {}).get("tags", []), "second code cell: the Colab cell"
    colab = "".join(code[1]["source"])
    assert f'%pip install -q "lessonkit @ git+{REPOSITORY}"' in colab and '"google.colab" in sys.modules' in colab
    src = "".join(code[0]["source"])
    for name in ("SMOKE", "INTERACTIVE", "SEED"):
        assert name in src, f"parameters cell lacks {name}"
    for c in code:
        text = "".join(c["source"])
        assert not c.get("outputs"), "committed notebooks carry no outputs"
        assert "%%time" not in text and "matplotlib.use" not in text


@pytest.mark.parametrize("nb", PRACTICE, ids=_rel)
def test_notebook_executes(nb, tmp_path):
    out = tmp_path / nb.name
    execute_notebook(nb, out, smoke=True, build_dir=tmp_path / "build")
    executed = json.loads(out.read_text())
    errors = [o for c in executed["cells"] for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
