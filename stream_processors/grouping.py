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
    """A group's rollouts so far, held parsed: a rollout is parsed once when it arrives, not again per member
    that follows (a replay spent a tenth of its time so)."""
    group_id: str
    first_seen: float  # wall clock, for the partial-group timeout
    rollouts: dict[str, CompleteRollout] = field(default_factory=dict)
    emitted: bool = False
    _raw: dict[str, bytes] = field(default_factory=dict, repr=False)  # rollout id → its bytes, when known

    def add(self, rollout: CompleteRollout, raw: bytes | None = None) -> None:
        """`raw`: the rollout's `dumps()` where the caller has it, so that writing the state does not redo it."""
        if rollout.rollout_id not in self.rollouts:
            self.rollouts[rollout.rollout_id] = rollout
            if raw is not None:
                self._raw[rollout.rollout_id] = raw

    def clear(self) -> None:
        """Let the rollouts go (the group went out): the state stays a marker."""
        self.rollouts.clear()
        self._raw.clear()

    def members(self) -> list[CompleteRollout]:
        return sorted(self.rollouts.values(), key=lambda r: r.rollout_id)

    def dumps(self) -> bytes:
        """A JSON header, then each rollout's JSON on a line of its own (orjson writes no raw newline)."""
        head = orjson.dumps({"group_id": self.group_id, "first_seen": self.first_seen, "emitted": self.emitted})
        return b"\n".join([head, *(self._raw.get(rid) or r.dumps() for rid, r in self.rollouts.items())])

    @classmethod
    def loads(cls, data: bytes) -> GroupState:
        head, *lines = data.split(b"\n")
        raw = orjson.loads(head)
        if "rollouts" in raw:  # written before the rollouts had lines of their own: JSON strings in the header
            lines = [v.encode() for v in raw["rollouts"].values()]
        state = cls(raw["group_id"], raw["first_seen"], emitted=raw["emitted"])
        for line in lines:
            state.add(CompleteRollout.loads(line), line)
        return state


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
