"""Train the workbook's own models on data/corpus/: tiny-moe (OLMoE-style target) and tiny-draft.

  tiny-moe    OlmoeForCausalLM: 8 experts, top-2, 4 layers, width 256, GQA 8/4 heads, qk-norm,
              untied embeddings, per-layer router load-balancing loss (coef 0.05) so routing does not collapse.
  tiny-draft  LlamaForCausalLM: dense, width 96, 2 layers, tied embeddings; at most 1/8 of the target's
              active parameters counted with or without embeddings; distilled from tiny-moe
              (loss = (1 - a) * CE + a * KL(target || draft)).

Training is deterministic on CPU (fixed seed, torch.use_deterministic_algorithms, a fixed number of
threads: 1 by default, because on a busy shared 2-core machine two OpenMP threads that wait for
each other ran about 10x slower than one); batches are windows of `seq_len + 1` tokens drawn with a seeded generator from the
token streams of the three corpus kinds, mixed by `mix`. The result is saved in Hugging Face format
under build/hf/<name>/ and converted to the engine's streaming layout under data/models/<name>/
(bf16 storage), with train_log.json (the loss curve's data) and card.md.

Shapes: B batch, T sequence, V vocabulary, E experts.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm
from transformers import (AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, OlmoeConfig, OlmoeForCausalLM,
                          PreTrainedTokenizerFast)

from lessonkit.files.atomic import atomic_write
from lessonkit.errors import LessonkitError
from lessonkit.files.resources import workbook_path, workbook_root
from lessonkit.engine.threads import pin_torch_threads
from lessonkit.engine.machine import machine_record
from lessonkit.models.convert import convert_hf_checkpoint, export_hf
from lessonkit.models.integrity import write_manifest
from lessonkit.models.registry import load_model
from lessonkit.training.distill import PRESETS as DISTILL_PRESETS
from lessonkit.training.distill import (DistillData, distill_data, distill_loss, heldout, student_agreement,
                                        teacher_model)
from lessonkit.training.model_card import model_card
from lessonkit.workloads.corpus import CORPUS_DIR, EOT, KINDS, load_documents, load_tokenizer

ROOT = workbook_root()
MODELS_DIR = workbook_path("data", "models")
HF_DIR = ROOT / "build" / "hf"


@dataclass(frozen=True)
class TrainConfig:
    name: str
    arch: str                       # "olmoe" or "llama"
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    intermediate_size: int
    n_experts: int = 1
    top_k: int = 1
    tie_embeddings: bool = False
    router_aux_loss_coef: float = 0.01
    seq_len: int = 256
    batch_size: int = 8
    steps: int = 1200
    lr: float = 2e-3
    min_lr_frac: float = 0.1
    warmup: int = 60
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    threads: int = 1                 # 1 thread: faster than 2 on a shared, busy 2-core machine
    mix: tuple = (("prose", 0.3), ("code", 0.35), ("records", 0.35))
    distill_from: str | None = None  # target model name: train on its teacher pass (workloads.distill)
    distill_preset: str | None = None  # distill.PRESETS name (default: distill_from)
    hard_weight: float = 0.5         # weight of the target's greedy pick next to its top-k distribution
    draft_for: str | None = None     # the target this drafter is measured against when shipped (default distill_from)
    eval_every: int = 50
    eval_windows: int = 12           # held-out windows per kind for the logged held-out loss
    log_every: int = 10


PRESETS = {
    "tiny-moe": TrainConfig(name="tiny-moe", arch="olmoe", dim=256, n_layers=4, n_heads=8, n_kv_heads=4,
                            intermediate_size=384, n_experts=8, top_k=2, batch_size=4, steps=700, lr=3e-3,
                            warmup=40, router_aux_loss_coef=0.05),
    "tiny-draft": TrainConfig(name="tiny-draft", arch="llama", dim=96, n_layers=2, n_heads=3, n_kv_heads=1,
                              intermediate_size=288, tie_embeddings=True, seq_len=96, batch_size=16, steps=800,
                              lr=4e-3, warmup=40, eval_every=200, distill_from="tiny-moe"),
    # the same drafter trained on the corpus text instead of its target's predictions: lesson 1's contrast
    "tiny-draft-corpus": TrainConfig(name="tiny-draft-corpus", arch="llama", dim=96, n_layers=2, n_heads=3,
                                     n_kv_heads=1, intermediate_size=288, tie_embeddings=True, seq_len=96,
                                     batch_size=16, steps=800, lr=4e-3, warmup=40, eval_every=200,
                                     draft_for="tiny-moe"),
}


# ----------------------------------------------------------------------------- data
def token_stream(tokenizer, kind: str, split: str, corpus_dir: str | Path = CORPUS_DIR) -> torch.Tensor:
    """All documents of one corpus part as one LongTensor, each document followed by EOT."""
    eot = tokenizer.token_to_id(EOT)
    ids: list[int] = []
    for enc in tokenizer.encode_batch(load_documents(kind, split, corpus_dir)):
        ids.extend(enc.ids)
        ids.append(eot)
    return torch.tensor(ids, dtype=torch.long)


def heldout_windows(tokenizer, n_per_kind: int, seq_len: int = 256,
                    corpus_dir: str | Path = CORPUS_DIR) -> dict[str, torch.Tensor]:
    """Fixed held-out windows per kind: the first n non-overlapping [seq_len + 1] slices."""
    out = {}
    for kind in KINDS:
        s = token_stream(tokenizer, kind, "heldout", corpus_dir)
        n = min(n_per_kind, len(s) // (seq_len + 1))
        out[kind] = s[: n * (seq_len + 1)].view(n, seq_len + 1)
    return out


def unigram_loss(tokenizer, windows: dict[str, torch.Tensor], corpus_dir: str | Path = CORPUS_DIR) -> dict:
    """Cross-entropy (nats/token) of an add-one unigram model fit on the train split."""
    V = tokenizer.get_vocab_size()
    counts = torch.ones(V, dtype=torch.float64)
    for kind in KINDS:
        counts += torch.bincount(token_stream(tokenizer, kind, "train", corpus_dir), minlength=V).double()
    logp = torch.log(counts / counts.sum())
    per = {k: float(-logp[w[:, 1:]].mean()) for k, w in windows.items()}
    per["mean"] = float(np.mean([per[k] for k in windows]))
    return per


class Batches:
    """Seeded windows of seq_len + 1 tokens; each row picks a kind by `mix` weight."""

    def __init__(self, streams: dict[str, torch.Tensor], mix, seq_len: int, batch_size: int, seed: int):
        self.kinds = [k for k, _ in mix]
        self.weights = torch.tensor([w for _, w in mix], dtype=torch.float64)
        self.streams, self.T, self.B = streams, seq_len, batch_size
        self.g = torch.Generator().manual_seed(seed)

    def next(self) -> torch.Tensor:
        rows = []
        kinds = torch.multinomial(self.weights, self.B, replacement=True, generator=self.g)
        for k in kinds.tolist():
            s = self.streams[self.kinds[k]]
            i = int(torch.randint(0, len(s) - self.T - 1, (1,), generator=self.g))
            rows.append(s[i: i + self.T + 1])
        return torch.stack(rows)


# ----------------------------------------------------------------------------- models
def hf_config(cfg: TrainConfig, tokenizer):
    eot = tokenizer.token_to_id(EOT)
    common = dict(vocab_size=tokenizer.get_vocab_size(), hidden_size=cfg.dim, num_hidden_layers=cfg.n_layers,
                  num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_kv_heads,
                  intermediate_size=cfg.intermediate_size, max_position_embeddings=1024,
                  tie_word_embeddings=cfg.tie_embeddings, bos_token_id=eot, eos_token_id=eot,
                  pad_token_id=eot, rms_norm_eps=1e-5, rope_theta=10000.0)
    if cfg.arch == "olmoe":
        return OlmoeConfig(num_experts=cfg.n_experts, num_experts_per_tok=cfg.top_k, norm_topk_prob=False,
                           router_aux_loss_coef=cfg.router_aux_loss_coef, output_router_logits=False, **common)
    if cfg.arch == "llama":
        return LlamaConfig(head_dim=cfg.dim // cfg.n_heads, **common)
    raise LessonkitError(f"unknown arch {cfg.arch!r} (expected 'olmoe' or 'llama')")


def build_model(cfg: TrainConfig, tokenizer):
    torch.manual_seed(cfg.seed)
    cls = OlmoeForCausalLM if cfg.arch == "olmoe" else LlamaForCausalLM
    return cls(hf_config(cfg, tokenizer))


def parameter_counts(model) -> dict:
    """Total and active parameters (per token), with and without the embedding matrices."""
    c = model.config
    total = sum(p.numel() for p in model.parameters())
    emb = model.get_input_embeddings().weight.numel()
    if not c.tie_word_embeddings:
        emb += model.get_output_embeddings().weight.numel()
    expert = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    n_exp = getattr(c, "num_experts", 1) or 1
    top_k = getattr(c, "num_experts_per_tok", 1) if n_exp > 1 else 1
    active = total - expert + expert * top_k // n_exp
    return {"total": total, "embedding": emb, "total_excl_embeddings": total - emb,
            "active": active, "active_excl_embeddings": active - emb}


def load_hf(name_or_dir: str | Path):
    """A trained model in HF format: build/hf/<name>/ if present, else exported from data/models/<name>/."""
    p = Path(name_or_dir)
    if not p.is_dir():
        p = HF_DIR / str(name_or_dir)
        if not (p / "config.json").exists():
            src = MODELS_DIR / str(name_or_dir)
            if not (src / "config.json").exists():
                raise LessonkitError(f"no trained model {name_or_dir!r}: neither {p} nor {src} exists")
            export_hf(src, p)
    return AutoModelForCausalLM.from_pretrained(str(p), dtype=torch.float32).eval()


@torch.no_grad()
def evaluate(model, windows: dict[str, torch.Tensor], batch: int = 8) -> dict:
    """Held-out cross-entropy (nats/token) per kind and their mean."""
    model.eval()
    out = {}
    for kind, w in windows.items():
        tot, n = 0.0, 0
        for i in range(0, len(w), batch):
            x = w[i: i + batch]
            logits = model(input_ids=x[:, :-1]).logits
            tot += float(F.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten(), reduction="sum"))
            n += x[:, 1:].numel()
        out[kind] = tot / n
    out["mean"] = float(np.mean([out[k] for k in windows]))
    model.train()
    return out


@torch.no_grad()
def expert_load(model, windows: dict[str, torch.Tensor]) -> list[list[float]]:
    """Share of routed token slots per expert, per layer, on held-out windows: [layers][E]."""
    c = model.config
    counts = torch.zeros(c.num_hidden_layers, c.num_experts)
    for w in windows.values():
        out = model(input_ids=w[:, :-1], output_router_logits=True)
        for l, rl in enumerate(out.router_logits):
            top = rl.topk(c.num_experts_per_tok, dim=-1).indices
            counts[l] += torch.bincount(top.flatten(), minlength=c.num_experts).float()
    return (counts / counts.sum(-1, keepdim=True)).tolist()


# ----------------------------------------------------------------------------- training
def load_balancing_loss(router_logits, top_k: int) -> torch.Tensor:
    """Switch-style balance loss per layer, averaged over layers: E * sum_e f_e * P_e, where f_e is the
    share of the T*top_k routed slots that go to expert e and P_e the mean router probability.
    1.0 when routing is uniform. (transformers' OLMoE loss pools all layers together, which let one
    layer starve an expert while the others compensated.)"""
    losses = []
    for rl in router_logits:                                   # [T, E] per layer
        probs = rl.float().softmax(-1)
        E = probs.shape[-1]
        top = probs.topk(top_k, dim=-1).indices
        f = F.one_hot(top, E).float().sum(1).mean(0) / top_k  # [E], sums to 1
        losses.append(E * (f * probs.mean(0)).sum())
    return torch.stack(losses).mean()


def cosine_lr(cfg, step: int) -> float:
    """Linear warm-up over cfg.warmup steps, then cosine from cfg.lr down to cfg.min_lr_frac x cfg.lr."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    p = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.min_lr_frac + (1 - cfg.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * p)))


def _save_hf(model, tokenizer_path: Path, out: Path) -> None:
    if out.exists():
        shutil.rmtree(out)
    model.save_pretrained(str(out))
    tok = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_path), bos_token=EOT, eos_token=EOT,
                                  pad_token=EOT, unk_token=None)
    tok.save_pretrained(str(out))
    shutil.copyfile(tokenizer_path, out / "tokenizer.json")  # the corpus tokenizer, byte for byte


def _losses(cfg: TrainConfig, model, x: torch.Tensor):
    """(loss, cross-entropy, router balance loss, distillation loss) of one batch of token windows x."""
    inp, tgt = x[:, :-1], x[:, 1:]
    if cfg.arch == "olmoe":
        out = model(input_ids=inp, output_router_logits=True)
        aux = load_balancing_loss(out.router_logits, cfg.top_k)
    else:
        out = model(input_ids=inp)
        aux = torch.zeros(())
    V = out.logits.shape[-1]
    ce = F.cross_entropy(out.logits.reshape(-1, V), tgt.reshape(-1))
    loss = ce + cfg.router_aux_loss_coef * aux if cfg.arch == "olmoe" else ce
    return loss, ce, aux, torch.zeros(())


def _distill_losses(cfg: TrainConfig, model, data: DistillData, idx: torch.Tensor):
    """(loss, CE against the target's greedy picks, 0, top-k distillation loss) of the rows idx."""
    logits = model.lm_head(model.model(input_ids=data.tokens[idx]).last_hidden_state.flatten(0, 1))
    ids, probs = data.topk_ids[idx].flatten(0, 1), data.topk_probs[idx].flatten(0, 1)
    kd = distill_loss(logits, ids, probs, cfg.hard_weight)
    ce = F.cross_entropy(logits, ids[:, 0].long())
    return kd, ce.detach(), torch.zeros(()), kd


def _objective(cfg: TrainConfig, tokenizer, corpus_dir, progress: bool):
    """(next batch, loss of a batch, extra log entries, held-out teacher data or None)."""
    if cfg.distill_from is None:
        streams = {k: token_stream(tokenizer, k, "train", corpus_dir) for k in KINDS}
        batches = Batches(streams, cfg.mix, cfg.seq_len, cfg.batch_size, cfg.seed)
        return batches.next, lambda m, x: _losses(cfg, m, x), {"train_tokens": {k: len(v) for k, v in streams.items()}}, None
    preset = cfg.distill_preset or cfg.distill_from
    data = distill_data(cfg.distill_from, preset, progress)
    held = distill_data(cfg.distill_from, heldout(DISTILL_PRESETS[preset]), progress)
    if data.tokens.shape[1] != cfg.seq_len:
        raise LessonkitError(f"{cfg.name}: seq_len {cfg.seq_len} != the teacher pass's rows ({data.tokens.shape[1]})")
    g = torch.Generator().manual_seed(cfg.seed)
    nxt = lambda: torch.randint(0, len(data.tokens), (cfg.batch_size,), generator=g)    # noqa: E731
    extra = {"train_tokens": {f"{s}/{k}": int(data.rows(k, s).numel() * cfg.seq_len) for s in ("text", "greedy")
                              for k in KINDS}, "distill_preset": preset}
    return nxt, lambda m, idx: _distill_losses(cfg, m, data, idx), extra, held


def _optimiser(cfg: TrainConfig, model) -> torch.optim.AdamW:
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))


def _log_step(log, bar, step, t0, cfg, losses) -> None:
    ce_f, aux_f, kl_f = (float(t.detach()) for t in losses[1:])
    log["steps"].append({"step": step, "ce": round(ce_f, 5), "aux": round(aux_f, 5), "kl": round(kl_f, 5),
                         "lr": cosine_lr(cfg, step), "elapsed_s": round(time.perf_counter() - t0, 2)})
    bar.set_postfix(ce=f"{ce_f:.3f}")


def train(cfg: TrainConfig, *, corpus_dir: str | Path = CORPUS_DIR, hf_out: str | Path | None = None,
          progress: bool = True) -> dict:
    """Train one model; saves it in HF format to hf_out (default build/hf/<name>) and returns the log."""
    pin_torch_threads(cfg.threads)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(cfg.seed)
    tokenizer, tok_path = load_tokenizer(corpus_dir), Path(corpus_dir) / "tokenizer.json"
    windows = heldout_windows(tokenizer, cfg.eval_windows, cfg.seq_len, corpus_dir)
    t_data = time.perf_counter()
    next_batch, loss_of, extra, held = _objective(cfg, tokenizer, corpus_dir, progress)
    t_data = time.perf_counter() - t_data
    model = build_model(cfg, tokenizer)
    model.train()
    opt = _optimiser(cfg, model)
    log = {"name": cfg.name, "config": asdict(cfg), "params": parameter_counts(model), **extra,
           "vocab_size": model.config.vocab_size,
           "steps": [], "eval": [], "teacher_pass_s": round(t_data, 1)}
    t0 = time.perf_counter()
    bar = tqdm(range(cfg.steps), desc=f"train {cfg.name}", disable=not progress, mininterval=2.0)
    for step in bar:
        for g in opt.param_groups:
            g["lr"] = cosine_lr(cfg, step)
        losses = loss_of(model, next_batch())
        opt.zero_grad(set_to_none=True)
        losses[0].backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        if step % cfg.log_every == 0 or step == cfg.steps - 1:
            _log_step(log, bar, step, t0, cfg, losses)
        if (step + 1) % cfg.eval_every == 0 or step == cfg.steps - 1:
            ev = evaluate(model, windows)
            if held is not None:
                ev.update(student_agreement(model, held))
            log["eval"].append({"step": step + 1, **{k: round(v, 5) for k, v in ev.items()}})
    log["train_time_s"] = round(time.perf_counter() - t0, 1)
    _final_log(log, cfg, model, windows, held, tokenizer, corpus_dir)
    out = Path(hf_out) if hf_out else HF_DIR / cfg.name
    _save_hf(model, tok_path, out)
    atomic_write(out / "train_log.json", json.dumps(log, indent=1).encode())
    return log


def _final_log(log, cfg, model, windows, held, tokenizer, corpus_dir) -> None:
    log["tokens_seen"] = cfg.steps * cfg.batch_size * cfg.seq_len
    log["heldout_loss"] = evaluate(model, windows)
    log["unigram_loss"] = unigram_loss(tokenizer, windows, corpus_dir)
    if cfg.arch == "olmoe":
        log["expert_load"] = expert_load(model, windows)
    if held is not None:
        log["heldout_agreement_with_" + cfg.distill_from] = student_agreement(model, held)
        log["teacher_params"] = parameter_counts(teacher_model(load_model(cfg.distill_from)))
    log["machine"] = {**machine_record(refuse_bad_weights=False), "threads": cfg.threads}    # the one record


# ----------------------------------------------------------------------------- shipping
def remeasure(name: str, measure: Callable[[Path], dict], model_dir: str | Path | None = None) -> dict:
    """Measure a shipped drafter again (after an engine change) and rewrite its card and manifest; the
    weights and the training figures stay as they are. Returns the new measurement."""
    out = Path(model_dir) if model_dir else MODELS_DIR / name
    if not (out / "train_log.json").exists():
        raise LessonkitError(f"{out} has no train_log.json: not a drafter shipped by `lessonkit train`")
    log = json.loads((out / "train_log.json").read_text(encoding="utf-8"))
    log["speculative"] = measure(out)
    _write_log_and_card(out, log)
    return log["speculative"]


def _write_log_and_card(out: Path, log: dict, trained: bool = False) -> None:
    """train_log.json (the loss curve is its "steps" and "eval"), card.md from it, then the manifest; each file
    replaced atomically, so an interrupted write leaves the old file, never half of one. Training draws nothing:
    after a new training (`trained`) the loss_curve.png an earlier one drew is removed, not left as this run's."""
    atomic_write(out / "train_log.json", json.dumps(log, indent=1).encode())
    if trained:
        (out / "loss_curve.png").unlink(missing_ok=True)
    files = {p.name: p.stat().st_size for p in sorted(out.iterdir()) if p.name != "card.md"}
    atomic_write(out / "card.md", model_card(log, files).encode())
    write_manifest(out)


def ship(name: str, *, hf_dir: str | Path | None = None, out_dir: str | Path | None = None,
         measure: Callable[[Path], dict] | None = None) -> Path:
    """Convert build/hf/<name> to data/models/<name> (bf16), with train_log.json and card.md;
    `measure(model_dir)` adds measured drafter figures (log["speculative"]) to the log and card."""
    hf = Path(hf_dir) if hf_dir else HF_DIR / name
    out = Path(out_dir) if out_dir else MODELS_DIR / name
    if not (hf / "train_log.json").exists():
        raise LessonkitError(f"{hf} has no train_log.json; run `lessonkit train {name}` first")
    log = json.loads((hf / "train_log.json").read_text(encoding="utf-8"))
    convert_hf_checkpoint(hf, out, dtype=torch.bfloat16)
    if measure is not None:
        log["speculative"] = measure(out)
    _write_log_and_card(out, log, trained=True)
    return out
