"""Conversion to and from the engine's streaming layout (lessonkit.engine.checkpoint describes it): a Hugging Face
checkpoint or state dict in, a Hugging Face folder out (for reference checks with transformers), and the one-off
repack of an older expert file into the packed layout. Loading a converted folder is the engine's job."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer

from lessonkit.files.atomic import atomic_write, remove_dead_temps
from lessonkit.engine.checkpoint import (FORMAT_VERSION, _atomic_save, _check_shapes, _layer_tensors, _Tensors,
                                         experts_layout, load_dense, load_experts, save_packed_experts)
from lessonkit.engine.config import ModelConfig
from lessonkit.errors import LessonkitError
from lessonkit.models.integrity import write_manifest


def convert_hf_state_dict(hf_config: dict, state_dict: dict[str, torch.Tensor], out_dir: str | Path,
                          tokenizer_json: str | None = None, dtype=torch.float32, source: str = "state dict") -> ModelConfig:
    """Write a Llama / OLMoE / Mixtral state dict (HF names) in the streaming layout. Returns the config."""
    c = ModelConfig.from_hf(hf_config, source=source)
    t = _Tensors(state_dict, source)
    dense = {"embed": t.take("model.embed_tokens.weight"), "norm": t.take("model.norm.weight")}
    if c.tie_embeddings:
        t.sd.pop("lm_head.weight", None)
    else:
        dense["lm_head"] = t.take("lm_head.weight")
    experts = {}
    for l in range(c.n_layers):
        _layer_tensors(c, t, l, dense, experts)
    leftover = [k for k in t.sd if "rotary_emb" not in k]
    if leftover:
        raise LessonkitError(f"{source}: unexpected tensors {leftover[:5]}{' ...' if len(leftover) > 5 else ''}")
    _check_shapes(c, dense, experts, source)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    remove_dead_temps(out)                  # a killed conversion's half-written files (a live writer's are kept)
    # one metadata key: safetensors writes metadata from a hash map, so with several keys their order (and
    # the file's bytes, and the SHA-256 fingerprint over them) would change from one conversion to the next
    meta = {"format": f"lessonkit-stream-v{FORMAT_VERSION}"}
    cast = lambda v: v if v.dtype == torch.uint8 else v.to(dtype)      # native blocks stay blocks
    _atomic_save({k: cast(v) for k, v in dense.items()}, out / "dense.safetensors", meta)
    save_packed_experts({k: cast(v) for k, v in experts.items()}, out / "experts.safetensors", c)
    c.save(out / "config.json")
    if tokenizer_json is not None:
        atomic_write(out / "tokenizer.json", tokenizer_json.encode("utf-8"))       # a reader sees no torn file
    write_manifest(out)
    return c


def repack_experts(model_dir: str | Path) -> bool:
    """Rewrite a model folder's format-1 experts.safetensors in the packed layout (atomically) and its
    manifest.json if it has one. Returns False when it is packed already. The values are unchanged (packing is a
    permutation), so every forward gives the same bits; the file's SHA-256, hence the engine's fingerprint, changes."""
    model_dir = Path(model_dir)
    path = model_dir / "experts.safetensors"
    if experts_layout(path) == 2:
        return False
    c = ModelConfig.load(model_dir / "config.json")
    try:
        experts = load_file(path)
    except (SafetensorError, OSError, Exception) as e:
        raise LessonkitError(f"{path}: corrupt or truncated safetensors ({e})") from None
    _check_shapes(c, {}, experts, str(path))
    save_packed_experts(experts, path, c)
    if (model_dir / "manifest.json").exists():
        names = list(json.loads((model_dir / "manifest.json").read_text(encoding="utf-8")).get("sha256", {}))
        write_manifest(model_dir, names or None)
    return True


def convert_hf_checkpoint(hf_dir: str | Path, out_dir: str | Path, dtype=torch.float32) -> ModelConfig:
    """Convert a Hugging Face directory (config.json + *.safetensors [+ tokenizer.json]) once."""
    hf_dir = Path(hf_dir)
    cfg_path = hf_dir / "config.json"
    if not cfg_path.exists():
        raise LessonkitError(f"{cfg_path}: not found (is {hf_dir} a Hugging Face checkpoint directory?)")
    hf_config = json.loads(cfg_path.read_text(encoding="utf-8"))
    files = sorted(hf_dir.glob("*.safetensors"))
    if not files:
        raise LessonkitError(f"{hf_dir}: no *.safetensors weight files")
    sd = {}
    for f in files:
        try:
            sd.update(load_file(f))
        except (SafetensorError, OSError) as e:
            raise LessonkitError(f"{f}: cannot read safetensors ({e})") from None
    tok = hf_dir / "tokenizer.json"
    return convert_hf_state_dict(hf_config, sd, out_dir, tok.read_text(encoding="utf-8") if tok.exists() else None, dtype,
                                 source=str(hf_dir))


def export_hf(stream_dir: str | Path, hf_dir: str | Path, dtype=torch.float32) -> Path:
    """Write OlmoeForCausalLM / LlamaForCausalLM files (+ a fast tokenizer) that transformers can load."""
    stream_dir, hf_dir = Path(stream_dir), Path(hf_dir)
    c = ModelConfig.load(stream_dir / "config.json")
    c.to_hf()                       # refuses what transformers cannot hold, before any file is written
    dense = load_dense(stream_dir, c)
    experts = load_experts(stream_dir, c)
    sd = {"model.embed_tokens.weight": dense["embed"], "model.norm.weight": dense["norm"]}
    sd["lm_head.weight"] = dense["embed"] if c.tie_embeddings else dense["lm_head"]
    for l in range(c.n_layers):
        p, q = f"model.layers.{l}.", f"layers.{l}."
        sd[p + "input_layernorm.weight"] = dense[q + "attn_norm"]
        sd[p + "post_attention_layernorm.weight"] = dense[q + "mlp_norm"]
        for a, b in (("wq", "q_proj"), ("wk", "k_proj"), ("wv", "v_proj"), ("wo", "o_proj")):
            sd[p + f"self_attn.{b}.weight"] = dense[q + a]
        if c.qk_norm:
            sd[p + "self_attn.q_norm.weight"] = dense[q + "q_norm"]
            sd[p + "self_attn.k_norm.weight"] = dense[q + "k_norm"]
        if c.is_moe:
            sd[p + "mlp.gate.weight"] = dense[q + "router"]
            for e in range(c.n_experts):
                w = experts[q + f"experts.{e}"]
                sd[p + f"mlp.experts.{e}.gate_proj.weight"] = w[0]
                sd[p + f"mlp.experts.{e}.up_proj.weight"] = w[1]
                sd[p + f"mlp.experts.{e}.down_proj.weight"] = w[2].T
        else:
            w = experts[q + "experts.0"]
            sd[p + "mlp.gate_proj.weight"], sd[p + "mlp.up_proj.weight"] = w[0], w[1]
            sd[p + "mlp.down_proj.weight"] = w[2].T
    if c.tie_embeddings:
        sd.pop("lm_head.weight")
    hf_dir.mkdir(parents=True, exist_ok=True)
    save_file({k: v.to(dtype).contiguous() for k, v in sd.items()}, hf_dir / "model.safetensors",
              metadata={"format": "pt"})
    (hf_dir / "config.json").write_text(json.dumps({**c.to_hf(), "torch_dtype": str(dtype).split(".")[-1]}, indent=2),
                                        encoding="utf-8")
    tok = stream_dir / "tokenizer.json"
    if tok.exists():
        (hf_dir / "tokenizer.json").write_text(tok.read_text(encoding="utf-8"), encoding="utf-8")
        special = _special_tokens(tok, c)
        (hf_dir / "tokenizer_config.json").write_text(json.dumps(
            {"tokenizer_class": "PreTrainedTokenizerFast", **special}, indent=2), encoding="utf-8")
    return hf_dir


def _special_tokens(tok_path: Path, c: ModelConfig) -> dict:
    try:
        t = Tokenizer.from_file(str(tok_path))
    except Exception as e:          # the tokenizers library raises a bare Exception on damaged JSON
        raise LessonkitError(f"{tok_path}: cannot load tokenizer ({e})") from None
    out = {}
    if c.bos_token_id is not None:
        out["bos_token"] = t.id_to_token(c.bos_token_id)
    if c.eos_ids:
        out["eos_token"] = t.id_to_token(c.eos_ids[0])
    return out


if __name__ == "__main__":          # python -m lessonkit.models.convert repack FOLDER (named by old_rows_error)
    import sys
    if len(sys.argv) != 3 or sys.argv[1] != "repack":
        sys.exit("usage: python -m lessonkit.models.convert repack FOLDER")
    try:
        done = repack_experts(sys.argv[2])
    except LessonkitError as e:
        sys.exit(f"error: {e}")
    print(f"{sys.argv[2]}: experts.safetensors " + ("rewritten in packed layout" if done else "already packed"))
