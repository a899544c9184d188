"""Tiny random Hugging Face models (a reference nobody here wrote), saved and converted for the engine."""
from __future__ import annotations

import torch
import transformers

from lessonkit.models.convert import convert_hf_checkpoint


def byte_tokenizer_json() -> str:
    """A byte-level BPE with no merges: 256 tokens, one per byte (enough for tests)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok.to_str()


def toy_bpe_tokenizer(texts, vocab_size: int):
    """A byte-level BPE trained on `texts` (an `<eos>` special token), small enough for grammar tests."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    t.train_from_iterator(texts, trainer)
    return t


def make_hf(kind: str, out_dir, seed: int = 0, **over):
    torch.manual_seed(seed)
    common = dict(vocab_size=300, hidden_size=64, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-5, eos_token_id=None,
                  bos_token_id=None, pad_token_id=None)
    common.update(over)
    if kind == "olmoe":
        cfg = transformers.OlmoeConfig(num_experts=8, num_experts_per_tok=2, norm_topk_prob=False, **common)
        model = transformers.OlmoeForCausalLM(cfg)
    elif kind == "llama":
        cfg = transformers.LlamaConfig(tie_word_embeddings=False, **common)
        model = transformers.LlamaForCausalLM(cfg)
    elif kind == "llama-tied":
        cfg = transformers.LlamaConfig(tie_word_embeddings=True, **common)
        model = transformers.LlamaForCausalLM(cfg)
    else:
        raise ValueError(kind)
    # random init is tiny (std 0.02): scale up so logits are not all near-ties
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() > 1:
                p.mul_(8.0)
    model.eval()
    hf_dir = out_dir / f"hf-{kind}"
    model.save_pretrained(hf_dir)
    (hf_dir / "tokenizer.json").write_text(byte_tokenizer_json())
    stream = out_dir / f"stream-{kind}"
    convert_hf_checkpoint(hf_dir, stream)
    return model, stream
