"""What the processors emit for the trainer: each task's rollouts, assembled into segments of tokens."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime

from schemas.events._checks import ROLLOUT_STATUS_RULE, ROLLOUT_STATUSES, require, require_aware, require_ids, utcnow


@dataclass(frozen=True, slots=True, kw_only=True)
class CallSpan:
    """Where one call's response lies in a segment's tokens (end exclusive)."""

    seq: int
    start: int
    end: int


@dataclass(frozen=True, slots=True, kw_only=True)
class StepReward:
    seq: int
    reward: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Segment:
    token_ids: list[int]
    loss_mask: list[bool]
    logprobs: list[float]
    weight_versions: list[int]
    spans: list[CallSpan] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        require(
            len(self.loss_mask) == len(self.logprobs) == len(self.weight_versions) == n,
            self,
            "token_ids, loss_mask, logprobs and weight_versions must have the same length",
        )
        require(all(0 <= sp.start <= sp.end <= n for sp in self.spans), self, "spans must lie within token_ids")


@dataclass(frozen=True, slots=True, kw_only=True)
class RolloutSample:
    rollout_id: str
    reward: float
    status: str
    segments: list[Segment]
    filled: bool = False
    step_rewards: list[StepReward] = field(default_factory=list)

    def __post_init__(self) -> None:
        require_ids(self, "rollout_id")
        require(math.isfinite(self.reward), self, "reward must be finite")
        require(self.status in ROLLOUT_STATUSES, self, ROLLOUT_STATUS_RULE)


@dataclass(frozen=True, slots=True, kw_only=True)
class DroppedRollout:
    rollout_id: str
    status: str
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskGroup:
    group_id: str
    run_id: str
    task_id: str
    group_size: int
    rollouts: list[RolloutSample]
    partial: bool = False
    dropped: list[DroppedRollout] = field(default_factory=list)
    created_at: datetime = field(default_factory=utcnow)

    def __post_init__(self) -> None:
        require_ids(self, "group_id", "run_id", "task_id")
        require(self.group_size >= 1, self, "group_size must be >= 1")
        require(
            len(self.rollouts) + len(self.dropped) <= self.group_size or self.partial,
            self,
            "more rollouts than group_size",
        )
        require_aware(self, "created_at")
