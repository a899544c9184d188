"""The semantic cache in front of a generative judge (the capstone's first stage, lessonkit.stack).

SemanticFront is lesson 5's one-sided + guard policy with audits, storing the judge's NDJSON answer lines;
with a trained judge it also keeps lesson 5's safety margin: a stored "no" answers a reworded item only when
the judge's log-odds for it were at least the judge's calibrated margin below its boundary.
"""
from __future__ import annotations

from lessonkit.errors import LessonkitError
from lessonkit.semcache.audit import AuditConfig, Auditor
from lessonkit.semcache.policies import SAFE_MARGINS, CosinePolicy
from lessonkit.semcache.store import CacheStore
from lessonkit.semcache.judge import RecordedJudge, TrainedJudge, answers_path, trained_prompt
from lessonkit.workloads.triage import ITEM_TEMPLATE, parse_answer


class SemanticFront:
    """One-sided + guard semantic cache with audits, in front of a judge.

    Only answers that parse with needs_action == false are stored, so a served answer is always a
    "no": a cached positive is never served. With a ``safe_margin`` (a trained judge's, lesson 5) a
    stored "no" is reused for other texts only when the judge's log-odds for it were at least that far
    below its boundary (``put``'s margin); a less confident "no" serves its own text only. A hit is
    audited on its entry's first `audit_first_n` uses and at `audit_rate` after; an audited hit runs
    the judge and serves its fresh answer.
    """

    def __init__(self, embeddings, texts, *, threshold: float = 0.85, audit_rate: float = 0.1,
                 audit_first_n: int = 1, seed: int = 0, safe_margin: float | None = None):
        self.emb = {t: e for t, e in zip(texts, embeddings)}
        self.safe_margin = safe_margin
        self.policy = CosinePolicy(threshold, one_sided=True, guard=True, safe_margin=safe_margin or 0.0)
        self.store = CacheStore(":memory:", "stack")
        self.auditor = Auditor(AuditConfig(rate=audit_rate, first_n=audit_first_n, seed=seed))
        self.answers: dict[int, str] = {}        # entry id -> cached answer line
        self.retired = 0

    def lookup(self, text: str):
        if not self.auditor.serving:
            return None
        return self.policy.lookup(self.store, text, self.emb[text])

    def put(self, text: str, answer: str, score=None) -> bool:
        """Store a "no"; score(text) -> the judge's log-odds, called only for a "no" and needed when the front
        has a safe margin."""
        obj = parse_answer(answer)
        if obj is None or not self.policy.cacheable(obj["needs_action"]):
            return False
        margin = None
        if self.safe_margin is not None:
            if score is None:
                raise LessonkitError("this semantic cache has a safe margin: storing a 'no' needs the judge's log-odds")
            margin = float(score(text))
        e = self.store.put(text, self.emb[text], obj["needs_action"], margin=margin)
        self.answers[e.id] = answer
        return True


def front_safe_margin(engine, prefix: str) -> float | None:
    """The semantic cache's safe margin for this judge: its calibrated one (semcache.policies.SAFE_MARGINS) when
    it is prompted as it was trained, else None (every stored "no" is reused, as before the margin)."""
    spec = trained_prompt(engine.name)
    if engine.name not in SAFE_MARGINS or spec is None or spec["prefix"] != prefix:
        return None
    return SAFE_MARGINS[engine.name]


def front_scorer(engine, prefix: str, recorded: bool = True):
    """The judge's log-odds for the capstone's semantic cache: log P(true) - log P(false) of the first value
    token of its NDJSON answer on its own prompt (prefix + ITEM_TEMPLATE + '{"needs_action":'), as lesson 5's
    TrainedJudge.score. recorded: read lesson 5's recorded scores where they come from exactly this judge and
    prompt (the same numbers, computed earlier), scoring live the rest. Returns (score function, live judge)."""
    live = TrainedJudge(engine, prefix, ITEM_TEMPLATE)
    scores = {}
    path = answers_path(engine.name)
    if recorded and path.exists():
        rec = RecordedJudge.from_file(path)
        if rec.score_fingerprint == live.score_fingerprint:
            scores = rec.scores
    return RecordedJudge(scores, live.score_fingerprint, 0.0, live).score, live
