"""The triage workload of lesson 6: monitoring items of the shipped stream judged by a generative judge
that answers one NDJSON line following JUDGE_SCHEMA, behind a long shared prefix (the instruction and
few-shot examples)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from lessonkit.errors import LessonkitError
from lessonkit.workloads.monitoring import load_stream

JUDGE_SCHEMA = {
    "type": "object",
    "properties": {"needs_action": {"type": "boolean"},
                   "severity": {"enum": ["low", "medium", "high"]},
                   "reason": {"type": "string"}},
    "required": ["needs_action", "severity", "reason"],
    "additionalProperties": False,
}

INSTRUCTION = """You triage monitoring items (alerts, log lines, metrics) for the on-call engineer of a \
small web shop. For each item, answer with exactly one line of JSON and nothing else: \
{"needs_action": true or false, "severity": "low", "medium" or "high", "reason": a short reason}. \
needs_action is true when a person must act now: a service is down or failing health checks, \
errors or refused connections repeat, a job exited with a non-zero code, replication lag, disk or \
memory is above its limit. It is false for routine, resolved or below-threshold items. Keep the \
reason short: quote the item's key fact. Answer every item the same way, however it is phrased.
"""

ITEM_TEMPLATE = "Item: {text}\nAnswer:\n"

STOP_STRINGS = ("\n",)



def example_answer(item) -> str:
    """The few-shot answer line for an item of the stream (its intended label, its own text as reason)."""
    return json.dumps({"needs_action": bool(item.needs_action),
                       "severity": "high" if item.needs_action else "low",
                       "reason": item.text}, separators=(",", ":"))


def build_prefix(examples) -> str:
    """Instruction + few-shot examples: the long prefix every judge call shares."""
    shots = "".join(ITEM_TEMPLATE.format(text=it.text) + example_answer(it) + "\n" for it in examples)
    return INSTRUCTION + "\n" + shots


def parse_answer(text: str) -> dict | None:
    """The answer as a dict when it is valid against JUDGE_SCHEMA's shape, else None."""
    try:
        obj = json.loads(text)
    except (ValueError, TypeError):
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("needs_action"), bool):
        return None
    return obj


def follows_schema(text: str) -> bool:
    """The answer is one JSON object with exactly JUDGE_SCHEMA's keys and value types (a full check)."""
    obj = parse_answer(text)
    return (obj is not None and set(obj) == set(JUDGE_SCHEMA["required"]) and
            obj["severity"] in JUDGE_SCHEMA["properties"]["severity"]["enum"] and isinstance(obj["reason"], str))


def needs_action(text: str) -> bool:
    """Fail safe: an answer that does not parse counts as "needs action" (never cached, never a no)."""
    obj = parse_answer(text)
    return True if obj is None else obj["needs_action"]


@dataclass
class Workload:
    items: list                     # MonitoringItem, judged in order
    examples: list                  # few-shot examples (disjoint from items)
    calibration: list               # drafter calibration items (disjoint from both)
    prefix: str
    warm: list = field(default_factory=list)   # texts the semantic cache saw before the items (warm start)

    @property
    def texts(self) -> list[str]:
        return [it.text for it in self.items]

    @property
    def cache_texts(self) -> list[str]:
        """The texts the semantic cache embeds: the warm-up texts, then the items."""
        return list(self.warm) + self.texts


def make_workload(cfg, stream=None) -> Workload:
    """cfg.n_items of the shipped stream after its first cfg.warm_items (those warm the semantic cache);
    cfg.n_examples few-shot examples and cfg.calibration_items calibration items from its far end
    (cfg: a lessonkit.stack.StackConfig)."""
    stream = list(stream) if stream is not None else load_stream()
    warm_n = cfg.warm_items
    need = warm_n + cfg.n_items + cfg.n_examples + cfg.calibration_items
    if len(stream) < need:
        raise LessonkitError(f"the stream has {len(stream)} items, the stack needs {need} "
                             f"({warm_n} warm-up + {cfg.n_items} items + examples and calibration)")
    warm, items = stream[:warm_n], stream[warm_n:warm_n + cfg.n_items]
    seen = {it.text for it in warm + items}
    tail = [it for it in reversed(stream[warm_n + cfg.n_items:]) if it.text not in seen and it.relation == "original"]
    pos = [it for it in tail if it.needs_action]
    neg = [it for it in tail if not it.needs_action]
    examples = []
    for i in range(cfg.n_examples):                     # alternate yes / no
        src = pos if i % 2 == 0 else neg
        examples.append(src.pop(0))
    cal = [it for it in tail if it not in examples][:cfg.calibration_items]
    return Workload(items, examples, cal, build_prefix(examples), [it.text for it in warm])
