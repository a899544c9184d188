"""Input-grounded requests: the answer mostly repeats the request's own text (fix, rename, convert,
extract). This is where prompt lookup drafting pays, and what editors, log tools and record
converters ask a local model all day."""
from __future__ import annotations

from lessonkit.models.gguf_loader import apply_chat_template

GROUNDED_REQUESTS = [
    "Fix the spelling in this sentence and return the corrected sentence only: The expert cahce keeps the "
    "most recentely used experts in memmory and streams the rest from disk.",
    "Rename the variable x to total in this function and return the code:\n"
    "def add_all(values):\n    x = 0\n    for v in values:\n        x = x + v\n    return x\n",
    "Convert this record to JSON: host=web-12 service=api level=error msg=connection pool exhausted on web-12",
    "Add type hints to this function and return the code:\ndef scale(values, factor):\n"
    "    return [v * factor for v in values]\n",
    "Summarise in one sentence, reusing the words of the text: The prefix cache stores the key and value "
    "tensors of a shared prompt header on disk, so a restarted process restores them instead of recomputing them.",
    "Return this list sorted alphabetically, one item per line:\nnginx\napi-gateway\npostgres\nredis\nworker\n",
    "Remove the comments from this code and return it:\nimport os  # the os module\n\n"
    "def home():  # the user's home\n    return os.path.expanduser('~')  # expand the tilde\n",
    "Correct the grammar and return the text: The verifier check every draft token and keep the longest "
    "prefix that match the target model output.",
]


def grounded_prompts(engine, n: int | None = None) -> list[list[int]]:
    """Token ids of the requests, each in the model's chat template when it has one."""
    texts = GROUNDED_REQUESTS[:n]
    if getattr(engine, "chat_template", None):
        texts = [apply_chat_template(engine, [{"role": "user", "content": t}]) for t in texts]
    return [engine.encode(t) for t in texts]
