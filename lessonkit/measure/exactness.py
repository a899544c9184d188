"""Exact decoding, shown (lesson 1, appendix A): the same prompts decoded many times, plainly and inside verify
batches of several widths, under several kernel thread counts, and the distinct completions counted (the
engine's paths give one per prompt). Beside it, the control: one row of a float matrix product computed alone
and inside batches of several widths by PyTorch's matmul, whose summation may depend on the batch, and the
distinct results counted (more than one where this CPU's BLAS moves the row's bits)."""
from __future__ import annotations

import pandas as pd
import torch

from lessonkit.engine import kernel
from lessonkit.engine.generate import generate
from lessonkit.engine.threads import torch_threads, use_threads
from lessonkit.speculative.drafters import OracleDrafter
from lessonkit.speculative.verify import speculative_generate


def distinct_completions(target, prompts: list[list[int]], *, widths=(2, 4, 8), threads=(1, 2),
                         max_new_tokens: int = 16, seed: int = 0) -> pd.DataFrame:
    """Per prompt: the runs (plain greedy, and speculative with an oracle that proposes the target's own tokens
    so that every verify forward is `width` rows wide, each under every kernel thread count) and how many
    distinct completions they gave."""
    old_threads = kernel.backend()["threads"]
    outs = {i: [] for i in range(len(prompts))}
    with torch_threads(torch.get_num_threads()):        # use_threads pins torch too: its count restored after
        try:
            for n in threads:
                use_threads(n)
                for i, p in enumerate(prompts):
                    outs[i].append(tuple(generate(target, p, max_new_tokens).token_ids))
                    for w in widths:
                        d = OracleDrafter(target, 0.0, seed=seed, horizon=max_new_tokens + w + 2)
                        outs[i].append(tuple(speculative_generate(target, d, p, max_new_tokens, k=w - 1).token_ids))
        finally:
            kernel.set_threads(old_threads)
    return pd.DataFrame([{"prompt": i, "runs": len(o), "verify_widths": ", ".join(map(str, (1, *widths))),
                          "threads": ", ".join(map(str, threads)), "distinct_completions": len(set(o))}
                         for i, o in outs.items()])


def float_row_control(d_in: int = 576, d_out: int = 2048, *, widths=(1, 2, 3, 4, 8, 16, 32), threads=(1, 2),
                      seed: int = 0) -> pd.DataFrame:
    """Row 0 of x @ W in float32 by torch.matmul, computed inside batches of each width under each torch thread
    count: the distinct bit patterns it took and the largest difference from the row computed alone."""
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(max(widths), d_in, generator=g), torch.randn(d_in, d_out, generator=g)
    rows = []
    for n in threads:
        with torch_threads(n):
            alone = torch.matmul(x[:1], w)[0]
            got = {tuple(torch.matmul(x[:b], w)[0].view(torch.int32).tolist()) for b in widths}
            diff = max(float((torch.matmul(x[:b], w)[0] - alone).abs().max()) for b in widths)
        rows.append({"torch_threads": n, "widths": ", ".join(map(str, widths)), "distinct_rows": len(got),
                     "max_abs_diff": diff})
    return pd.DataFrame(rows)
