"""Joining one rollout's events: calls, seal, start, reward and finish, in any order, duplicates ignored. Pure.

A rollout is complete when it is started, sealed, finished, and every call
the seal lists has arrived. Only the sealed calls are used: a call whose
acknowledgement timed out may still land, but the gateway did not count it.

The state holds the rollout's lifecycle, never its calls: those are kept
apart, one entry per call (`calls.CallStore`), so an event costs the size of
that event, not of the rollout so far. It changes only on lifecycle events
and the rollout's first call, and is plain data (JSON bytes) so a Faust table
can hold it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson

from schemas.events import (
    CallSpan,
    Event,
    ModelCall,
    RewardReported,
    RolloutFinished,
    RolloutSealed,
    RolloutStarted,
    Segment,
    StepReward,
    run_of,
)
from stream_processors.assembly import Call, assemble, unresolved


@dataclass(frozen=True)
class CompleteRollout:
    """What the grouping step needs of a rollout: its place, its outcome, its segments."""
    rollout_id: str
    run_id: str
    group_id: str
    task_id: str
    group_size: int
    status: str
    reward: float | None
    reason: str | None
    retry_of: str | None
    finished_at: str  # ISO 8601: it becomes the TaskGroup's created_at, so replays agree
    segments: list[Segment]
    step_rewards: list[StepReward] = field(default_factory=list)
    #: why its record cannot be trained on, however it ended (a call it cannot rebuild): the group drops it
    dropped: str | None = None

    def dumps(self) -> bytes:
        return orjson.dumps(self)  # orjson walks dataclasses natively, far faster than asdict (and than packing)

    @classmethod
    def loads(cls, data: bytes) -> CompleteRollout:
        raw = orjson.loads(data)
        # .get: a table written before spans and step rewards existed still loads
        raw["segments"] = [Segment(**{**s, "spans": [CallSpan(**sp) for sp in s.get("spans", [])]})
                           for s in raw["segments"]]
        raw["step_rewards"] = [StepReward(**r) for r in raw.get("step_rewards", [])]
        return cls(**raw)


def call_of(event: ModelCall) -> Call:
    """What the join keeps of a call."""
    return Call(event.call_id, event.seq, event.choice_index, event.prompt_token_ids, event.response_token_ids,
                event.response_logprobs, event.weight_version, event.status == "ok", event.extends)


@dataclass
class RolloutJoin:
    rollout_id: str
    run_id: str = ""
    started: dict[str, Any] | None = None
    finished: dict[str, Any] | None = None
    reward: float | None = None
    steps: dict[str, float] = field(default_factory=dict)  # call id → its step reward (the first reported)
    sealed: list[str] | None = None
    first_call: int | None = None  # where its calls begin on tether.calls (an offset of its partition)
    done: bool = False  # emitted: later duplicates change nothing

    def apply(self, event: Event, offset: int | None = None) -> bool:
        """Take a lifecycle event, or note a call (`offset`: its place on tether.calls, for a live join); whether
        the state changed."""
        if self.done:
            return False
        before = (self.run_id, self.started, self.finished, self.reward, len(self.steps), self.sealed,
                  self.first_call)
        self.run_id = self.run_id or run_of(event) or ""
        if isinstance(event, ModelCall):
            if offset is not None and (self.first_call is None or offset < self.first_call):
                self.first_call = offset
        elif isinstance(event, RolloutSealed):
            self.sealed = self.sealed if self.sealed is not None else list(event.call_ids)
        elif isinstance(event, RolloutStarted):
            self.started = self.started or {"group_id": event.group_id, "task_id": event.task_id,
                                            "group_size": event.group_size, "retry_of": event.retry_of,
                                            "started_at": event.started_at.timestamp(),
                                            "validation": event.validation}
        elif isinstance(event, RewardReported) and event.call_id is not None:
            self.steps.setdefault(event.call_id, event.reward)
        elif isinstance(event, RewardReported):
            self.reward = event.reward if self.reward is None else self.reward
        elif isinstance(event, RolloutFinished):
            self.finished = self.finished or {"status": event.status, "reward": event.reward,
                                              "reason": event.reason, "finished_at": _iso(event.finished_at)}
        return before != (self.run_id, self.started, self.finished, self.reward, len(self.steps), self.sealed,
                          self.first_call)

    @property
    def validation(self) -> bool:
        """A held-out validation rollout: joined like any other, never made a sample to train on."""
        return bool(self.started and self.started.get("validation"))

    @property
    def waiting_for_calls(self) -> bool:
        """Started, sealed and finished: all it may still lack is calls."""
        return not self.done and self.started is not None and self.finished is not None and self.sealed is not None

    def missing(self, calls: Mapping[str, Call]) -> list[str]:
        return [c for c in self.sealed or [] if c not in calls]

    def complete(self, calls: Mapping[str, Call]) -> bool:
        return self.waiting_for_calls and not self.missing(calls)

    def result(self, calls: Mapping[str, Call]) -> CompleteRollout:
        assert self.started is not None and self.finished is not None and self.sealed is not None
        sealed = [calls[cid] for cid in self.sealed]
        reward = self.finished["reward"] if self.finished["reward"] is not None else self.reward
        broken = unresolved(sealed)
        return CompleteRollout(
            self.rollout_id, self.run_id, self.started["group_id"], self.started["task_id"],
            self.started["group_size"], self.finished["status"], reward, self.finished["reason"],
            self.started["retry_of"], self.finished["finished_at"], [] if broken else assemble(sealed),
            self._step_rewards(sealed), dropped=broken and f"its record is incomplete: {broken}")

    def _step_rewards(self, calls: list[Call]) -> list[StepReward]:
        """Step rewards of the sealed calls, by seq; a call is named by its recorded id or the id of its call (the
        recorded one without its choice suffix), which the gateway gives the harness. Others count for nothing."""
        seqs: dict[str, int] = {}
        for c in calls:
            seqs.setdefault(c.call_id, c.seq)
            seqs.setdefault(c.call_id.rsplit("-", 1)[0], c.seq)
        by_seq: dict[int, float] = {}
        for call_id, reward in self.steps.items():
            if call_id in seqs:
                by_seq.setdefault(seqs[call_id], reward)
        return [StepReward(seq=seq, reward=r) for seq, r in sorted(by_seq.items())]

    def close(self) -> None:
        """Keep only the marker: the table stays small, and late duplicates are ignored."""
        self.done, self.sealed, self.steps = True, [], {}

    def dumps(self) -> bytes:
        return orjson.dumps(self)  # orjson walks dataclasses natively, far faster than asdict

    @classmethod
    def loads(cls, data: bytes) -> RolloutJoin:
        raw = orjson.loads(data)
        raw.pop("calls", None)  # a state written before calls were kept apart: its calls are read back from the log
        return cls(**raw)


def _iso(moment: datetime) -> str:
    return moment.isoformat()
