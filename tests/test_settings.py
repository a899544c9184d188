"""The run's settings in one object (lessonkit.engine.settings, lessonkit.engine.active): from_env reads the
LESSONKIT_* variables that choose them (tests/test_layout.py holds it the only reader), default() decides the
thread default once, and use() changes them for a block and restores every one after, on an exception too."""
from __future__ import annotations

import contextlib

import pytest

import lessonkit.engine.kernel as K
from lessonkit.engine import active, c_plan, settings
from lessonkit.engine.packed_layout import choose_weights
from lessonkit.errors import LessonkitError

def test_from_env_normalises_and_refuses():
    s = settings.from_env({"LESSONKIT_KERNEL": " AVX2 ", "LESSONKIT_THREADS": "3", "LESSONKIT_FORWARD": "torch"})
    assert s == settings.RunSettings(kernel="avx2", numerics="auto", threads=3, weights="auto", forward="torch")
    assert settings.from_env({}) == settings.RunSettings()
    with pytest.raises(LessonkitError, match=r"LESSONKIT_THREADS='two': expected a positive integer"):
        settings.from_env({"LESSONKIT_THREADS": "two"})
    with pytest.raises(LessonkitError, match="one setting now, LESSONKIT_KERNEL"):
        settings.from_env({"LESSONKIT_ISA": "avx2"})
    with pytest.raises(AttributeError):                  # frozen
        s.threads = 4


def test_default_is_decided_once(monkeypatch):
    first = settings.default()
    monkeypatch.setattr(settings, "physical_cores", lambda: first.threads + 7)
    assert settings.default() is first and first.threads >= 1
    assert active.describe()["default_threads"] == first.threads


def _state():
    return K.BACKEND, K.WHY, K.NUMERICS, K.NUMERICS_WHY, K.THREADS, settings.current(), c_plan.requested_path()


@pytest.mark.parametrize("fail", [False, True])
def test_use_changes_every_setting_and_restores_them(monkeypatch, fail):
    monkeypatch.delenv("LESSONKIT_WEIGHTS", raising=False)
    monkeypatch.delenv("LESSONKIT_FORWARD", raising=False)
    before = _state()
    path = "mkl" if K._rowkernel is None else "portable"
    changes = {"kernel": path, "threads": 2, "weights": "f32", "forward": "torch"}
    if K._rowkernel is not None:
        changes["numerics"] = "int8"
    with pytest.raises(RuntimeError) if fail else contextlib.nullcontext():
        with active.use(**changes) as s:
            assert (K.BACKEND, c_plan.requested_path(), choose_weights()[0]) == (path, "torch", "f32")
            assert s.threads == 2 and s.forward == "torch" and s.kernel == path
            if K._rowkernel is not None:
                assert K.NUMERICS == "int8" and K.THREADS == 2
            if fail:
                raise RuntimeError("inside the block")
    assert _state() == before


def test_use_refuses_before_changing_anything():
    before = _state()
    for bad, err in (({"kernel": "sse"}, ValueError), ({"forward": "gpu"}, ValueError),
                     ({"weights": "q2"}, ValueError), ({"colour": "red"}, ValueError),
                     ({"threads": 0}, ValueError)):
        with pytest.raises(err):
            with active.use(**bad):
                pass
        assert _state() == before



# ---- the one papermill parameter `lessonkit run` hands each notebook (SETTINGS) ----------------------------
def test_the_notebook_parameter_is_the_settings_and_refuses_what_is_not():
    s = settings.RunSettings(numerics="int8", threads=2)
    assert settings.from_parameter(settings.parameter(s)) == s
    assert settings.from_parameter(None) == settings.RunSettings()
    assert settings.from_parameter({"numerics": " INT8 ", "threads": 2}) == s      # a researcher's partial dict
    for bad, err in (("int8", "expected a mapping"), ({"colour": "red"}, "unknown setting 'colour'"),
                     ({"threads": 0}, "threads=0"), ({"threads": "2"}, "threads='2'"), ({"threads": True}, "threads=True")):
        with pytest.raises(LessonkitError, match=err):
            settings.from_parameter(bad)


def test_adopt_takes_the_parameter_for_the_process_and_checks_all_first(monkeypatch):
    import torch
    monkeypatch.delenv("LESSONKIT_FORWARD", raising=False)
    monkeypatch.setattr(active, "_ADOPTED", contextlib.ExitStack())
    before, torch_before = _state(), torch.get_num_threads()
    with pytest.raises(ValueError):
        active.adopt({"forward": "torch", "weights": "q2"})               # refused: nothing taken
    assert _state() == before
    try:
        assert active.adopt(None) == settings.current() and _state() == before
        s = active.adopt({"forward": "torch", "threads": 2})
        assert s.forward == "torch" and s.threads == 2 and c_plan.requested_path() == "torch"
        assert torch.get_num_threads() == 2 and (K._rowkernel is None or K.THREADS == 2)
        with active.use(forward="c"):                                   # a comparison inside a notebook
            assert c_plan.requested_path() == "c"
        assert c_plan.requested_path() == "torch"                       # back to what the notebook adopted
    finally:
        active._ADOPTED.close()
        torch.set_num_threads(torch_before)
    assert _state() == before
