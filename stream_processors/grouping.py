"""Complete rollouts → one TaskGroup per task (docs/architecture.md, "A task group"). Pure.

A group is ready when `group_size` of its rollouts have ended for good:
succeeded, failed or timeout. `lost` and `cancelled` rollouts are attempts the
controller replaces with a new one, so they never count; they are listed as
dropped only in a partial group (one that timed out waiting, because a slot
ran out of attempts or a rollout never completed). Failed and timed-out
rollouts are dropped, or kept with a fill reward, by policy; either way the
group records it. A rollout whose record cannot be trained on (a call it
cannot rebuild) counts, and is dropped with the reason, whatever the policy.
Everything is ordered by rollout id and stamped with the latest finish time,
so the same rollouts always give the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

import orjson

from schemas.events import DroppedRollout, RolloutSample, TaskGroup
from stream_processors.join import CompleteRollout

COUNTED = frozenset({"succeeded", "failed", "timeout"})


@dataclass(frozen=True)
class Policy:
    failed: Literal["drop", "fill"] = "drop"
    fill_reward: float = 0.0


@dataclass
class GroupState:
    group_id: str
    first_seen: float  # wall clock, for the partial-group timeout
    rollouts: dict[str, bytes] = field(default_factory=dict)  # rollout id → CompleteRollout.dumps()
    emitted: bool = False

    def add(self, rollout: CompleteRollout) -> None:
        self.rollouts.setdefault(rollout.rollout_id, rollout.dumps())

    def members(self) -> list[CompleteRollout]:
        return sorted((CompleteRollout.loads(b) for b in self.rollouts.values()), key=lambda r: r.rollout_id)

    def dumps(self) -> bytes:
        return orjson.dumps({"group_id": self.group_id, "first_seen": self.first_seen, "emitted": self.emitted,
                             "rollouts": {k: v.decode() for k, v in self.rollouts.items()}})

    @classmethod
    def loads(cls, data: bytes) -> GroupState:
        raw = orjson.loads(data)
        return cls(raw["group_id"], raw["first_seen"], {k: v.encode() for k, v in raw["rollouts"].items()},
                   raw["emitted"])


def ready(members: list[CompleteRollout]) -> bool:
    if not members:
        return False
    return sum(1 for r in members if r.status in COUNTED) >= members[0].group_size


def build(members: list[CompleteRollout], policy: Policy, partial: bool = False) -> TaskGroup:
    """The TaskGroup of these rollouts (all of one group): at most group_size counted ones, by rollout id."""
    first = members[0]
    counted = [r for r in members if r.status in COUNTED][:first.group_size]
    others = [] if not partial else [r for r in members if r.status not in COUNTED]
    kept: list[RolloutSample] = []
    dropped: list[DroppedRollout] = []
    for r in counted:
        if r.dropped is not None:
            dropped.append(DroppedRollout(rollout_id=r.rollout_id, status=r.status, reason=r.dropped))
        elif r.status == "succeeded" and r.reward is not None:
            kept.append(RolloutSample(rollout_id=r.rollout_id, reward=r.reward, status=r.status,
                                      segments=r.segments, step_rewards=r.step_rewards))
        elif policy.failed == "fill":
            kept.append(RolloutSample(rollout_id=r.rollout_id, reward=policy.fill_reward, status=r.status,
                                      segments=r.segments, filled=True, step_rewards=r.step_rewards))
        else:
            dropped.append(DroppedRollout(rollout_id=r.rollout_id, status=r.status,
                                          reason=r.reason or ("no reward" if r.reward is None else r.status)))
    dropped += [DroppedRollout(rollout_id=r.rollout_id, status=r.status, reason=r.reason or r.status)
                for r in others]
    stamps = [datetime.fromisoformat(r.finished_at) for r in [*counted, *others]]
    return TaskGroup(group_id=first.group_id, run_id=first.run_id, task_id=first.task_id,
                     group_size=first.group_size, rollouts=kept, dropped=dropped,
                     partial=partial or len(counted) < first.group_size, created_at=max(stamps))
