"""Held-out validation of a weight version: started by the controller, scored per sampling setting."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime

from schemas.events._checks import require, require_aware, require_ids, utcnow


@dataclass(frozen=True, slots=True, kw_only=True)
class ValidationStarted:
    """The held-out rollouts of `version` are out: the trainer waits for their report before its next update."""
    run_id: str
    version: int
    rollouts: int
    started_at: datetime = field(default_factory=utcnow)

    def __post_init__(self) -> None:
        require_ids(self, "run_id")
        require(self.version >= 0, self, "version must be >= 0")
        require(self.rollouts >= 0, self, "rollouts must be >= 0")
        require_aware(self, "started_at")


@dataclass(frozen=True, slots=True, kw_only=True)
class ValidationScore:
    """One sampling setting's score on the held-out tasks."""
    setting: str
    rollouts: int
    mean_reward: float
    temperature: float | None = None
    unrewarded: int = 0
    duration_s: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ValidationReported:
    run_id: str
    version: int
    scores: list[ValidationScore]
    seconds: float = 0.0
    reported_at: datetime = field(default_factory=utcnow)

    def __post_init__(self) -> None:
        require_ids(self, "run_id")
        require(self.version >= 0, self, "version must be >= 0")
        require(all(math.isfinite(s.mean_reward) for s in self.scores), self, "mean_reward must be finite")
        require_aware(self, "reported_at")
