"""The process the kill tests (tests/test_kill.py) kill: `python tests/kill_child.py JOB ARGS...` runs one
writing job of the workbook on a slow disk, so that a SIGKILL at a random moment lands inside its writes.

The slow disk is this script's, not the workbook's: every write the workbook makes (the atomic helper's
write_all, safetensors' save_file, Path.write_text / write_bytes) goes out in CHUNK-byte pieces with a
PAUSE_S pause after each, nothing else changes. Jobs:
  prefix-cache DIR PROMPT   lessonkit generate --model tiny-moe --prefix-cache DIR (greedy, 4 new tokens)
  convert HF_DIR OUT        lessonkit.models.convert.convert_hf_checkpoint(HF_DIR, OUT)
  judge OUT                 train_adapter(TINY_JUDGE) and save_adapter(..., OUT)
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CHUNK, PAUSE_S = 8192, 0.002


def slow_disk() -> None:
    import safetensors.torch as st

    import lessonkit.files.atomic as atomic
    import lessonkit.engine.checkpoint as checkpoint
    import lessonkit.models.convert as convert
    import lessonkit.training.judge as judge_train

    def write_slowly(fd: int, data) -> None:
        view = memoryview(bytes(data))
        while view:
            n = os.write(fd, view[:CHUNK])
            view = view[n:]
            time.sleep(PAUSE_S)

    def save_file(tensors, filename, metadata=None):
        data = st.save(tensors, metadata=metadata)
        fd = os.open(filename, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            write_slowly(fd, data)
        finally:
            os.close(fd)

    def write_bytes(self, data):
        fd = os.open(self, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            write_slowly(fd, data)
        finally:
            os.close(fd)
        return len(data)

    def write_text(self, text, encoding=None, errors=None, newline=None):
        return write_bytes(self, text.encode(encoding or "utf-8", errors or "strict"))

    atomic.write_all = write_slowly
    checkpoint.save_file = convert.save_file = judge_train.save_file = save_file
    Path.write_bytes, Path.write_text = write_bytes, write_text


TINY_JUDGE = dict(model="tiny-moe", n_top=1, rank=2, epochs=1, batch=8, n_originals=6, n_shots=2, warmup=2)


def main(job: str, *args: str) -> int:
    slow_disk()
    if job == "prefix-cache":
        from lessonkit.cli import main as cli
        return cli(["generate", "--model", "tiny-moe", "--prompt", args[1], "--max-new-tokens", "4", "--json",
                    "--prefix-cache", args[0]])
    if job == "convert":
        from lessonkit.models.convert import convert_hf_checkpoint
        convert_hf_checkpoint(args[0], args[1])
        return 0
    if job == "judge":
        from lessonkit.training.judge import JudgeTrainConfig, save_adapter, train_adapter
        cfg = JudgeTrainConfig(**TINY_JUDGE)
        model, log = train_adapter(cfg, progress=False)
        save_adapter(model, cfg, {k: v for k, v in log.items() if k not in ("cache_s", "cycle_s", "train_time_s")},
                     Path(args[0]))
        return 0
    raise SystemExit(f"unknown job {job!r}")


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
