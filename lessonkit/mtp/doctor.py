"""The head doctor: is an MTP head healthy, and what did quantisation do to it?

Unhealthy when: a tensor is missing / non-finite / never trained; a column block of eh_proj is
(almost) all zero after quantisation (per-row int4 with a 20-30x scale ratio between its halves);
acceptance at position 1 is within `margin` of the controls (the target's pick one position off, a
random head); or quantisation loses more than `max_rel_drop` of the float head's acceptance.
"""
from __future__ import annotations

import math

import torch

from lessonkit.engine.quant import block_report, fake_quantise, get_scheme, scale_ratio
from lessonkit.mtp.evaluate import acceptance_by_kind, eval_windows, pooled_acceptance
from lessonkit.mtp.head import MATRICES, NORMS, MtpHead, Shared, eh_scale_ratio, init_head, load_head

def tensor_problems(head: MtpHead, reference: MtpHead | None = None) -> list[str]:
    """Missing, mis-shaped, non-finite and never-trained (still at their initial values / random-looking) tensors."""
    out = []
    for name, shape in head.cfg.shapes().items():
        t = head.w.get(name)
        if t is None:
            out.append(f"tensor {name} is missing")
            continue
        if tuple(t.shape) != shape:
            out.append(f"tensor {name} has shape {tuple(t.shape)}, expected {shape}")
            continue
        if not torch.isfinite(t.float()).all():
            out.append(f"tensor {name} has {int((~torch.isfinite(t.float())).sum())} non-finite values")
            continue
        if name in NORMS and bool((t.float() == 1).all()):
            out.append(f"tensor {name} is exactly 1 everywhere: never trained (initial value)")
        if name in MATRICES and looks_random(t):
            out.append(f"tensor {name} looks random (singular values of i.i.d. noise): never trained?")
    return out


def looks_random(w: torch.Tensor) -> bool:
    """An i.i.d. matrix's top singular value is about std * (sqrt(m) + sqrt(n)); training grows it far above."""
    w = w.float()
    m, n = w.shape
    top = float(torch.linalg.matrix_norm(w, ord=2))
    return top < 1.5 * float(w.std()) * (math.sqrt(m) + math.sqrt(n))


def quant_report(head: MtpHead, scheme: str) -> dict:
    """For each matrix: scale ratio between column blocks, and per block zeros and reconstruction error."""
    rep = {}
    for name in MATRICES:
        w = head.w[name].float()
        blocks = head.cfg.eh_blocks() if name == "eh_proj" else {"all": slice(None)}
        wq = fake_quantise(w, scheme)
        rep[name] = {"scale_ratio": scale_ratio(w, blocks), "blocks": block_report(w, wq, blocks)}
    return rep


def _quant_verdicts(report: dict) -> tuple[list[str], bool]:
    """What quantisation did to the matrices: (verdicts, whether a half of eh_proj is zeroed)."""
    verdicts, zeroed_block = [], False
    eh = report["quant_matrices"]["eh_proj"]["blocks"]
    for half, other in (("embedding", "the input token"), ("hidden", "the target's hidden state")):
        fz = eh[half]["frac_zero"]
        if fz > 0.9:
            zeroed_block = True
            verdicts.append(f"the {half} half of eh_proj is zero after quantisation ({100 * fz:.1f}% of its "
                            f"weights rounded to 0; column-block scale ratio "
                            f"{report['quant_matrices']['eh_proj']['scale_ratio']:.1f}x): the head never sees "
                            f"{other}")
        elif eh[half]["rel_error"] > 0.5:
            verdicts.append(f"the {half} half of eh_proj is badly reconstructed after quantisation "
                            f"(relative error {eh[half]['rel_error']:.2f})")
    for name, r in report["quant_matrices"].items():
        if name != "eh_proj" and r["blocks"]["all"]["frac_zero"] > 0.5:
            verdicts.append(f"{name}: {100 * r['blocks']['all']['frac_zero']:.0f}% of weights rounded to zero")
    return verdicts, zeroed_block


def _acceptance_verdicts(report: dict, evaluated: dict, float_eval: dict | None, rand: dict, quant: str,
                         margin: float, max_rel_drop: float) -> tuple[list[str], bool]:
    """Acceptance at position 1 against the controls and the float head: (verdicts, still healthy)."""
    verdicts, ok = [], True
    a1 = evaluated["acceptance"][0]
    ctrl = max(evaluated["shifted_control"], rand["acceptance"][0])
    report["acceptance_pos1"] = a1
    report["control_pos1"] = ctrl
    report["true_token_rank_median"] = evaluated["rank_median"]
    if a1 < ctrl + margin:
        ok = False
        verdicts.append(f"acceptance at position 1 is {100 * a1:.1f}%, no better than the controls "
                        f"({100 * ctrl:.1f}%): the drafts are useless; the target's pick ranks "
                        f"#{evaluated['rank_median']:.0f} of {report['vocab_size']} (median) in the draft logits")
    if quant != "none" and float_eval is not None:
        f1 = float_eval["acceptance"][0]
        if a1 < (1 - max_rel_drop) * f1:
            ok = False
            verdicts.append(f"{quant} quantisation drops acceptance at position 1 from {100 * f1:.1f}% "
                            f"(float head) to {100 * a1:.1f}%; the target's pick now ranks "
                            f"#{evaluated['rank_median']:.0f} (median, float head: #{float_eval['rank_median']:.0f})")
    return verdicts, ok


def doctor(target, head: MtpHead | None = None, quant: str = "none", *, n_per_kind: int = 3, seq_len: int = 128,
           depth: int = 3, states: dict | None = None, progress: bool = False, margin: float = 0.05,
           max_rel_drop: float = 0.2) -> dict:
    """Examine a head: tensors, acceptance per position against controls, and what quantisation did."""
    get_scheme(quant)
    head = head if head is not None else load_head(target)
    sh = Shared.from_engine(target)
    states = states if states is not None else eval_windows(target, n_per_kind, seq_len, progress=progress)
    problems = tensor_problems(head)
    verdicts: list[str] = [f"tensor check: {p}" for p in problems]

    def pooled(h):
        return pooled_acceptance(acceptance_by_kind(h, sh, states, depth), depth)

    float_eval = pooled(head) if not problems or all("never trained" in p or "random" in p for p in problems) else None
    rand = pooled(MtpHead(head.cfg, init_head(head.cfg, seed=12345), dtype=head.dtype))
    report = {"model": target.name, "quant": quant, "tensor_problems": problems, "float": float_eval,
              "random_head_control": {"acceptance": rand["acceptance"], "rank_median": rand["rank_median"]},
              "scale_ratio_eh_proj": eh_scale_ratio(head), "vocab_size": head.cfg.vocab_size}
    evaluated = float_eval
    zeroed_block = False
    if quant != "none":
        report["quant_matrices"] = quant_report(head, quant)
        evaluated = report["quantised"] = pooled(head.quantised(quant))
        more, zeroed_block = _quant_verdicts(report)
        verdicts += more
    healthy = not problems and not zeroed_block and evaluated is not None
    if evaluated is not None:
        more, ok = _acceptance_verdicts(report, evaluated, float_eval, rand, quant, margin, max_rel_drop)
        verdicts += more
        healthy = healthy and ok
    if healthy:
        verdicts.append(f"healthy: acceptance at position 1 is {100 * report['acceptance_pos1']:.1f}% "
                        f"(controls {100 * report['control_pos1']:.1f}%), positions 1..{depth}: "
                        + ", ".join(f"{100 * a:.1f}%" for a in evaluated["acceptance"]))
    report["healthy"] = healthy
    report["verdict"] = verdicts
    return report


def format_report(rep: dict) -> str:
    lines = [f"MTP head doctor: {rep['model']}, quantisation {rep['quant']}"]
    if rep.get("float"):
        lines.append("  float head acceptance by position: " + ", ".join(f"{100 * a:.1f}%" for a in rep["float"]["acceptance"]))
    if rep.get("quantised"):
        lines.append(f"  {rep['quant']} head acceptance by position: "
                     + ", ".join(f"{100 * a:.1f}%" for a in rep["quantised"]["acceptance"]))
    if "control_pos1" in rep:
        lines.append(f"  controls (shifted target / random head), position 1: {100 * rep['control_pos1']:.1f}%")
        lines.append(f"  median rank of the target's pick in the draft logits: #{rep['true_token_rank_median']:.0f} "
                     f"of {rep['vocab_size']}")
    lines.append(f"  eh_proj column-block scale ratio (hidden / embedding): {rep['scale_ratio_eh_proj']:.1f}x")
    for name, r in rep.get("quant_matrices", {}).items():
        b = "; ".join(f"{k}: {100 * v['frac_zero']:.0f}% zero, rel. error {v['rel_error']:.3f}" for k, v in r["blocks"].items())
        lines.append(f"  {name:8s} ratio {r['scale_ratio']:5.1f}x  {b}")
    lines.append("verdict: " + ("HEALTHY" if rep["healthy"] else "UNHEALTHY"))
    lines += [f"  - {v}" for v in rep["verdict"]]
    return "\n".join(lines)
