"""The audit of a semantic cache: re-run the judge on some served hits and bound the loss rate.

Served hits are shadow-audited: the cached answer is served, then the judge runs fresh on the same
item and the two are compared. Every hit of a new entry is audited until it has ``first_n`` audits
(the probation period); after that a seeded random sample at ``rate``.

The loss-rate bound is the one-sided Clopper-Pearson upper bound at ``confidence`` (95%): the
largest rate p such that seeing <= k losses in n audits still has probability >= 1 - confidence.
With k = 0 it is 1 - 0.05**(1/n), about 3/n (the "rule of three"): zero losses in 30 audits means
the rate is at most about 10%, not zero.

Stop rule: an entry (or the whole policy) stops serving once it has at least one audited loss and
its upper bound exceeds ``limit``.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from scipy.stats import beta

from lessonkit.errors import LessonkitError


def clopper_pearson_upper(losses: int, audits: int, confidence: float = 0.95) -> float:
    """One-sided Clopper-Pearson upper bound on a binomial rate (1.0 when nothing was audited)."""
    if audits < 0 or losses < 0 or losses > audits:
        raise LessonkitError(f"need 0 <= losses <= audits, got losses={losses}, audits={audits}")
    if not 0.0 < confidence < 1.0:
        raise LessonkitError(f"confidence must be in (0, 1), got {confidence}")
    if losses == audits:
        return 1.0
    return float(beta.ppf(confidence, losses + 1, audits - losses))


def allows_serving(losses: int, audits: int, limit: float, confidence: float = 0.95) -> bool:
    """The stop rule: keep serving unless a loss was seen and the upper bound exceeds ``limit``."""
    return losses == 0 or clopper_pearson_upper(losses, audits, confidence) <= limit


@dataclass
class AuditConfig:
    rate: float = 0.05          # share of served hits re-checked after probation
    first_n: int = 2            # hits of a new entry that are always audited
    limit: float = 0.10         # stop serving when the upper bound exceeds this
    confidence: float = 0.95
    seed: int = 0
    stop_policy: bool = True    # also stop the whole policy on its pooled bound

    def __post_init__(self):
        if not 0.0 <= self.rate <= 1.0:
            raise LessonkitError(f"audit rate must be in [0, 1], got {self.rate}")
        if self.first_n < 0:
            raise LessonkitError(f"first_n must be >= 0, got {self.first_n}")
        if not 0.0 < self.limit <= 1.0:
            raise LessonkitError(f"audit limit must be in (0, 1], got {self.limit}")


@dataclass
class Auditor:
    """Decides which hits to audit and keeps pooled counts for the policy-level stop rule."""
    config: AuditConfig = field(default_factory=AuditConfig)
    audits: int = 0
    losses: int = 0
    stopped_at: int | None = None      # query index at which the policy stopped serving (-1: in an earlier run)
    trajectory: list = field(default_factory=list)   # (query index, audits, losses, upper bound)

    def __post_init__(self):
        self.rng = random.Random(self.config.seed)

    def should_audit(self, entry_audits: int) -> bool:
        if entry_audits < self.config.first_n:
            return True
        return self.rng.random() < self.config.rate

    def record(self, agreed: bool, query_index: int) -> None:
        self.audits += 1
        self.losses += 0 if agreed else 1
        self.trajectory.append((query_index, self.audits, self.losses, self.upper_bound()))
        if (self.config.stop_policy and self.stopped_at is None and
                not allows_serving(self.losses, self.audits, self.config.limit, self.config.confidence)):
            self.stopped_at = query_index

    def entry_allows(self, entry_losses: int, entry_audits: int) -> bool:
        return allows_serving(entry_losses, entry_audits, self.config.limit, self.config.confidence)

    @property
    def serving(self) -> bool:
        return self.stopped_at is None

    def upper_bound(self) -> float:
        return clopper_pearson_upper(self.losses, self.audits, self.config.confidence)
