"""Chat templates (Jinja, as shipped with the model) for prompting instruct models."""
from __future__ import annotations

from .errors import LessonkitError


def apply_chat_template(engine, messages: list[dict], add_generation_prompt: bool = True) -> str:
    """Render the engine's own chat template (saved next to its weights when it was converted)."""
    from .gguf_loader import render_chat_template
    tpl = getattr(engine, "chat_template", None)
    if not tpl:
        raise LessonkitError(f"model {engine.name!r} has no chat template")
    c, tok = engine.config, engine.tokenizer
    bos = tok.id_to_token(c.bos_token_id) if c.bos_token_id is not None else ""
    eos = tok.id_to_token(c.eos_ids[0]) if c.eos_ids else ""
    return render_chat_template(tpl, messages, add_generation_prompt, bos_token=bos or "", eos_token=eos or "")
