"""The torch-free generate (lessonkit.engine.lean, issue 60 item 6): the same tokens, logits, packed bytes and tables
as the torch engine on both numerics and thread counts, no torch imported, and a peak resident set under 400 MB."""
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from lessonkit.engine import active, c_plan, kernel, lean
from lessonkit.engine import packed_layout as pl
from lessonkit.engine.config import ModelConfig
from lessonkit.engine.generate import generate
from lessonkit.engine.model import rope_tables
from lessonkit.models.lean_load import built_dir, torch_free_dir
from lessonkit.models.listing import MODELS_DIR
from lessonkit.models.registry import load_model

NUMERICS = ("exact", "int8")
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,"]
SECONDS = ("wall_s", "ttft_s", "io_s", "tokens_per_s")      # the stats that are timings, not counts
RSS_TARGET_MB = 400          # issue 60: `generate --model smollm2-135m --max-new-tokens 32 --threads 1`


def _reference_pack(raw: torch.Tensor, kind: str) -> torch.Tensor:
    """The strip-blocks as the torch engine packed them before packing moved to numpy (blocks._pack_strips of
    2026-12-04), written in torch: the reference the one implementation is held to."""
    nb = pl.BLOCK_BYTES[kind]
    blocks = raw.view(raw.shape[0], -1, nb)
    d = blocks[..., 0:2].contiguous().view(torch.float16)[..., 0]
    m = None if kind == "q8_0" else blocks[..., 2:4].contiguous().view(torch.float16)[..., 0]
    q = blocks[..., 2:].contiguous() if kind == "q8_0" else torch.cat([blocks[..., 4:] & 15, blocks[..., 4:] >> 4], -1)
    n, b = d.shape
    n_pad = -(-n // pl.STRIP) * pl.STRIP
    d = torch.cat([d, d.new_zeros(n_pad - n, b)])
    m = None if m is None else torch.cat([m, m.new_zeros(n_pad - n, b)])
    q = torch.cat([q, q.new_zeros(n_pad - n, b, pl.QK)])
    s = n_pad // pl.STRIP
    scale = lambda t: t.view(s, pl.STRIP, b).permute(0, 2, 1).contiguous().view(torch.uint8)
    codes = q.view(s, pl.STRIP, b, pl.QK).permute(0, 2, 3, 1)
    if kind == "q4_1":
        codes = codes[:, :, 0::2] | (codes[:, :, 1::2] << 4)
    parts = [scale(d)] + ([] if m is None else [scale(m)]) + [codes.reshape(s, b, -1)]
    return torch.cat(parts, dim=-1).reshape(-1)


@pytest.mark.parametrize("kind", ["q4_1", "q8_0"])
@pytest.mark.parametrize("n", [1, 15, 16, 17, 100, 2049 + 16])
def test_pack_blocks_equals_the_reference(kind, n):
    raw = np.random.default_rng(n).integers(0, 256, (n, 3 * pl.BLOCK_BYTES[kind]), dtype=np.uint8)
    want = _reference_pack(torch.from_numpy(raw), kind).numpy()
    assert pl.pack_blocks(raw, kind).tobytes() == want.tobytes()
    assert pl.pack_blocks(raw, kind, chunk=16).tobytes() == want.tobytes()        # chunked: the same bytes
    from lessonkit.engine import blocks as qb
    assert qb.pack_blocks(torch.from_numpy(raw), kind).numpy().tobytes() == want.tobytes()


@pytest.fixture(scope="module", params=NUMERICS)
def engines(request):
    """(the torch engine, the torch-free engine) of smollm2-135m, both prepared for one numerics."""
    with active.use(numerics=request.param):
        yield load_model("smollm2-135m"), lean.LeanEngine(built_dir("smollm2-135m"), name="smollm2-135m")


def test_the_same_packed_bytes_and_tables(engines):
    eng, free = engines
    wt = dict(eng.model.wt)
    for l in range(eng.config.n_layers):
        mlp = eng.store.get(l, 0)
        wt[f"layers.{l}.gate_up"], wt[f"layers.{l}.down"] = mlp.gate_up_t, mlp.down_t
    assert set(free.wt) <= set(wt) and len(free.wt) == 4 * eng.config.n_layers + 1
    for name, w in free.wt.items():
        assert (w.k, w.n, w.code, w.path) == (wt[name].k, wt[name].n, wt[name].code, wt[name].path), name
        assert w.data.tobytes() == wt[name].data.numpy().tobytes(), name
    assert np.array_equal(free.vectors["cos"], eng.model.cos.numpy())
    assert np.array_equal(free.vectors["sin"], eng.model.sin.numpy())
    assert np.array_equal(free.dims, eng.model.c_forward.dims.numpy())


@pytest.mark.parametrize("threads", [1, 2])
def test_the_same_tokens_and_logits(engines, threads):
    eng, free = engines
    kernel.set_threads(threads)
    try:
        for prompt in PROMPTS:
            ids = eng.encode(prompt)
            a, b = generate(eng, ids, 32, use_eos=False), generate(free, ids, 32, use_eos=False)
            assert b.token_ids == a.token_ids and b.text == a.text
            counts = lambda st: {k: v for k, v in st.items() if k not in SECONDS}
            assert counts(b.stats) == counts(a.stats) and len(counts(a.stats)) == len(a.stats) - len(SECONDS)
            full = ids + a.token_ids
            want = eng.forward(full, eng.new_cache(len(full))).numpy()
            assert np.array_equal(free.forward(full, free.new_cache(len(full))), want)
    finally:
        kernel.set_threads(1)


def test_a_changed_weight_is_seen(engines):
    """The comparisons above can fail: one scale changed in one matrix changes the logits."""
    eng, free = engines
    ids = eng.encode(PROMPTS[0])
    w = free.wt["layers.3.wqkv"]
    old = w.data[:2].copy()
    try:
        w.data[:2] = [0, 60]                    # the first strip-block's first scale: f16 2.0
        got = free.forward(ids, free.new_cache(len(ids)))
    finally:
        w.data[:2] = old
    assert not np.array_equal(got, eng.forward(ids, eng.new_cache(len(ids))).numpy())


def test_rope_tables_are_one_implementation():
    """model.rope_tables is c_plan's (the torch-free generate's): float32 angles, cos and sin rounded once."""
    c = ModelConfig.load(MODELS_DIR / "tiny-draft" / "config.json")
    cos, sin = rope_tables(c, 200)
    want_cos, want_sin = c_plan.rope_tables(c, 200)
    assert np.array_equal(cos.numpy(), want_cos) and np.array_equal(sin.numpy(), want_sin)
    angle = np.float32(199) * (np.float32(1) / np.float32(c.rope_theta ** (2 / c.head_dim)))
    assert want_cos[199, 1] == np.float32(np.cos(np.float64(angle)))


@pytest.mark.parametrize("ask, env, model, why", [
    ("sampling", {}, "smollm2-135m", "sampling runs on torch"),
    (None, {"LESSONKIT_FORWARD": "torch"}, "smollm2-135m", "LESSONKIT_FORWARD=torch"),
    (None, {"LESSONKIT_WEIGHTS": "f32"}, "smollm2-135m", "f32 weights"),
    (None, {}, "tiny-moe", "a mixture of experts"),
    (None, {}, "tiny-draft", "float weights"),
    (None, {}, "smollm2-135m-judge", "not a registered model built already"),
])
def test_what_takes_the_torch_engine(monkeypatch, ask, env, model, why):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    d, reason = torch_free_dir(model, None, ask)
    assert d is None and why in reason
    monkeypatch.delenv("LESSONKIT_FORWARD", raising=False)
    monkeypatch.delenv("LESSONKIT_WEIGHTS", raising=False)
    assert torch_free_dir("smollm2-135m")[0] == built_dir("smollm2-135m")


RUN = """
import json, sys
from pathlib import Path
from lessonkit.cli import main
rc = main(["generate", "--model", "smollm2-135m", "--prompt", {prompt!r}, "--max-new-tokens", "32", "--threads", "1",
           "--numerics", {numerics!r}, "--json"] + {extra!r})
print(json.dumps({{"rc": rc, "torch": "torch" in sys.modules,
                  "peak_mb": peak_kb() / 1024}}))
"""
# VmHWM, the peak of this process's own memory (ru_maxrss would keep the pytest parent's across the fork and exec)
PEAK = "def peak_kb():\n    return next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM:'))\n"


def _command(numerics: str, extra: list[str], prompt: str = PROMPTS[1]) -> tuple[dict, dict]:
    """(the command's JSON, {rc, torch imported, peak RSS}) of `lessonkit generate` in a fresh process."""
    r = subprocess.run([sys.executable, "-c", PEAK + RUN.format(prompt=prompt, numerics=numerics, extra=extra)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.strip().splitlines()
    return json.loads("\n".join(lines[:-1])), json.loads(lines[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the peak from /proc/self/status")
@pytest.mark.parametrize("numerics", NUMERICS)
def test_the_command_runs_without_torch_under_400_mb(numerics):
    doc, proc = _command(numerics, [])
    assert proc == {"rc": 0, "torch": False, "peak_mb": proc["peak_mb"]}
    assert doc["forward"] == "C forward without torch" and doc["torch_imported"] is False
    assert proc["peak_mb"] <= RSS_TARGET_MB, f"peak RSS {proc['peak_mb']:.0f} MB"
    with active.use(numerics=numerics):
        eng = load_model("smollm2-135m")
    assert doc["token_ids"] == generate(eng, eng.encode(PROMPTS[1]), 32).token_ids


def test_sampling_takes_the_torch_engine_and_says_so():
    doc, proc = _command("exact", ["--temperature", "0.7", "--seed", "3"])
    assert proc["torch"] and doc["torch_imported"] is True
    assert doc["forward"] == "torch engine: sampling runs on torch"
