"""Issue 53's loose ends, each checked where it was left open: a dead writer's temporary files in a conversion's
folder, the judge's ground truth written crash-safely, the shipped drafters in the packed format (their tokens
unchanged), a complete training log, and a training that writes its curve as data and draws nothing."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from lessonkit.files.atomic import TMP_PREFIX, temp_path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))


def dead_pid() -> int:
    """The id of a process that has exited (and been reaped)."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_conversion_removes_a_dead_writers_temporary_files_and_keeps_a_live_ones(tmp_path):
    from hf_tiny import make_hf

    from lessonkit.models.convert import convert_hf_checkpoint
    make_hf("olmoe", tmp_path / "ref")
    out = tmp_path / "out"
    out.mkdir()
    dead = out / f"{TMP_PREFIX}{dead_pid()}-0123456789ab.part"      # what a SIGKILLed conversion leaves
    dead.write_bytes(b"half a safetensors file")
    live = temp_path(out)                                            # this process's: a writer still at work
    live.write_bytes(b"being written")
    convert_hf_checkpoint(tmp_path / "ref" / "hf-olmoe", out)
    assert not dead.exists() and live.exists()
    assert sorted(p.name for p in out.glob("*.part")) == [live.name]


def test_the_judges_ground_truth_is_old_or_whole_when_the_disk_fills_mid_write(tmp_path, monkeypatch):
    import errno
    import types

    import lessonkit.files.atomic as atomic
    from lessonkit.semcache.judge import write_ground_truth
    judge = types.SimpleNamespace(engine=types.SimpleNamespace(name="stand-in"), score_fingerprint="f",
                                  instruction="Is this an incident?")
    path = tmp_path / "judge_ground_truth.json"
    write_ground_truth(judge, {"item a": 1.0}, path)
    old = path.read_bytes()

    def full_disk(fd, data):                        # half the bytes reach the disk, then it is full
        import os
        os.write(fd, bytes(data)[:len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(atomic, "write_all", full_disk)
    try:
        write_ground_truth(judge, {f"item {i}": float(i) for i in range(500)}, path)
    except OSError as e:
        assert e.errno == errno.ENOSPC
    assert path.read_bytes() == old
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


# ---- the shipped models ------------------------------------------------------------------------------------------
DRAFTERS = ["tiny-draft", "tiny-draft-corpus", "smollm2-draft"]


def shipped_trained_models() -> list[Path]:
    """Every model folder that `lessonkit train` shipped with a card written from its log (judges have their own)."""
    from lessonkit.models.registry import MODELS_DIR
    return sorted(d for d in MODELS_DIR.iterdir() if (d / "train_log.json").exists() and (d / "config.json").exists())


@pytest.mark.parametrize("name", DRAFTERS)
def test_a_shipped_drafter_is_packed_listed_in_its_manifest_and_gives_its_old_layouts_tokens(name, tmp_path):
    from test_packed_format import PROMPTS, _format1_copy, _tokens

    from lessonkit.engine.checkpoint import experts_layout
    from lessonkit.models.convert import repack_experts
    from lessonkit.models.integrity import verify_manifest, write_manifest
    from lessonkit.models.registry import MODELS_DIR, load_model
    shipped = MODELS_DIR / name
    assert experts_layout(shipped / "experts.safetensors") == 2
    status = verify_manifest(shipped)
    assert "experts.safetensors" in status and set(status.values()) == {"ok"}, status
    old = _format1_copy(shipped, tmp_path / name)                   # the values in the layout it shipped in before
    write_manifest(old)
    # by folder, as the registry loads them: smollm2-draft borrows its embedding from smollm2-135m (borrow.json)
    assert _tokens(load_model(str(old)), PROMPTS, 8) == _tokens(load_model(str(shipped)), PROMPTS, 8)
    assert repack_experts(old) and (old / "experts.safetensors").read_bytes() == (shipped / "experts.safetensors").read_bytes()


@pytest.mark.parametrize("model_dir", shipped_trained_models(), ids=lambda d: d.name)
def test_a_shipped_models_card_is_what_its_training_log_gives(model_dir):
    """train_log.json holds every figure the card generator reads (vocab_size included), and card.md is its
    output for the files as shipped: nothing hand-edited, nothing stale."""
    import json

    from lessonkit.training.model_card import model_card
    log = json.loads((model_dir / "train_log.json").read_text(encoding="utf-8"))
    files = {p.name: p.stat().st_size for p in sorted(model_dir.iterdir()) if p.name != "card.md"}
    assert model_card(log, files) == (model_dir / "card.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("name", ["tiny-draft", "smollm2-draft"])
def test_a_new_training_writes_its_curve_as_data_and_draws_nothing(name, tmp_path):
    """`lessonkit train` draws no figure: shipping a new training writes train_log.json (the loss curve is its
    "steps" and "eval") and a card that says so, and removes the loss_curve.png an earlier training drew."""
    import json
    import shutil

    from lessonkit.models.registry import MODELS_DIR
    from lessonkit.training.tiny_models import _write_log_and_card
    for f in ("train_log.json", "loss_curve.png", "config.json"):
        shutil.copyfile(MODELS_DIR / name / f, tmp_path / f)
    _write_log_and_card(tmp_path, json.loads((tmp_path / "train_log.json").read_text(encoding="utf-8")), trained=True)
    card = (tmp_path / "card.md").read_text(encoding="utf-8")
    assert not (tmp_path / "loss_curve.png").exists() and "loss_curve.png" not in card
    assert '"steps" and "eval" of train_log.json' in card
