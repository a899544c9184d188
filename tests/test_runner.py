"""The main job's report: executed notebook, figures as PNG, summary.md and summary.json."""
import json

from lessonkit.lessons.runner import run_all


def test_run_writes_the_report(tmp_path):
    assert run_all(build_dir=tmp_path, smoke=True, only=["06_gap"]) == 0
    assert (tmp_path / "notebooks" / "06_gap_analysis.ipynb").exists()
    pngs = list((tmp_path / "figures").glob("06_gap_analysis_fig*.png"))
    assert pngs and all(p.read_bytes()[:4] == b"\x89PNG" for p in pngs)
    summary = json.loads((tmp_path / "summary.json").read_text())["lessons"]["06_gap_analysis"]
    assert summary["status"] == "ok" and summary["figures"]
    md = (tmp_path / "summary.md").read_text()
    assert "| 06_gap_analysis | ok" in md and "notebooks/06_gap_analysis.ipynb" in md and "figures/" in md
    for name, value in summary["figures"].items():
        assert name in md
