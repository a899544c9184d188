"""Chat templates (Jinja, as shipped with the model) for prompting instruct models."""
from __future__ import annotations

from .errors import LessonkitError


def apply_chat_template(engine, messages: list[dict], add_generation_prompt: bool = True) -> str:
    tpl = getattr(engine, "chat_template", None)
    if not tpl:
        raise LessonkitError(f"model {engine.name!r} has no chat template")
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(tpl).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                       bos_token="", eos_token="")
