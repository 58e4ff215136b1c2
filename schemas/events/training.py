"""What the trainer reports per update, with the advantage it gave each rollout."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from schemas.events._checks import require, require_aware, require_ids, utcnow


@dataclass(frozen=True, slots=True, kw_only=True)
class CallAdvantage:
    seq: int
    advantage: float


@dataclass(frozen=True, slots=True, kw_only=True)
class RolloutAdvantage:
    """What the trainer gave one rollout: the page shows it beside the reward, as it was, not recomputed."""
    group_id: str
    rollout_id: str
    advantage: float
    calls: list[CallAdvantage] = field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainerStep:
    run_id: str
    version: int
    task_groups: int
    tokens: int
    mean_reward: float
    loss: float
    entropy: float
    clip_fraction: float
    kl: float
    grad_norm: float
    staleness_mean: float
    staleness_max: float
    dropped_stale: int = 0
    dropped_no_signal: int = 0
    seconds: float = 0.0
    advantages: list[RolloutAdvantage] = field(default_factory=list)
    stepped_at: datetime = field(default_factory=utcnow)

    def __post_init__(self) -> None:
        require_ids(self, "run_id")
        require(self.version >= 1, self, "version must be >= 1")
        require_aware(self, "stepped_at")
