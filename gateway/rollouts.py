"""What the gateway knows of each rollout: who it belongs to, its call order, its record, its own turns.

A rollout is registered by the controller, then receives calls (each gets the
next seq), then is sealed: sealing waits for its calls in flight, and its
RolloutSealed event lists exactly the calls whose events Kafka acknowledged.
This is a cache of what the log holds (`gateway.readback`): a rollout this
process does not know, or has forgotten, is restored from the log.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from gateway.errors import RolloutAlreadySealed, RolloutNotFound
from gateway.extends import Tip
from gateway.readback import Recovered
from gateway.render import RenderState


@dataclass
class Rollout:
    rollout_id: str
    run_id: str
    next_seq: int = 0
    acknowledged: list[str] = field(default_factory=list)
    in_flight: int = 0
    sealed: bool = False
    #: assistant turns the model produced here, by message_key → the exact token ids of each, in order
    turns: dict[str, list[list[int]]] = field(default_factory=dict)
    n_turns: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    since: float = field(default_factory=time.time)  # the earliest it can have started: where its history begins
    #: answers kept for reference by id while the rollout is open (Responses' store): (request, response) JSON
    answers: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: calls answered with an error because their events were not acknowledged in time (they may land later)
    unacknowledged: set[str] = field(default_factory=set)
    #: the latest acknowledged answers, oldest first: what a new call's record may extend (gateway.extends)
    tips: deque[Tip] = field(default_factory=deque)
    #: how its latest call's prompt was rendered: where the next call's rendering resumes (gateway.render)
    rendered: RenderState | None = None

    def __post_init__(self) -> None:
        self.idle.set()


class Rollouts:
    """Live rollouts, and the most recent `max_sealed` sealed ones (older ones are forgotten: 404, not 409)."""

    def __init__(self, max_turns_per_rollout: int = 10_000, max_sealed: int = 100_000, max_tips: int = 4) -> None:
        self._by_id: dict[str, Rollout] = {}
        self._sealed: deque[str] = deque()
        self.max_turns = max_turns_per_rollout
        self.max_sealed = max_sealed
        self.max_tips = max_tips

    def register(self, rollout_id: str, run_id: str) -> Rollout:
        """Idempotent: registering again returns the same rollout (the controller may retry)."""
        existing = self._by_id.get(rollout_id)
        if existing is not None:
            return existing
        rollout = self._by_id[rollout_id] = Rollout(rollout_id, run_id, tips=deque(maxlen=self.max_tips))
        return rollout

    def restore(self, rollout_id: str, recovered: Recovered, since: float) -> Rollout:
        """The rollout as the log has it; one this process knows already is kept (it may be serving calls)."""
        existing = self._by_id.get(rollout_id)
        if existing is not None:
            return existing
        rollout = self._by_id[rollout_id] = Rollout(rollout_id, recovered.run_id, next_seq=recovered.next_seq,
                                                    acknowledged=list(recovered.acknowledged), since=since,
                                                    tips=deque(recovered.tips, maxlen=self.max_tips))
        if recovered.sealed:
            self._mark_sealed(rollout)
        else:
            for key, ids in recovered.turns:
                self.remember_turn(rollout, key, ids)
            rollout.answers.update(recovered.answers)
        return rollout

    def find(self, rollout_id: str) -> Rollout | None:
        return self._by_id.get(rollout_id)

    def forget(self, rollout_id: str) -> bool:
        """Another replica wrote for it: what this process holds may be stale, so the log is read again. A
        rollout with calls in flight here is kept (it is this process that is serving it)."""
        rollout = self._by_id.get(rollout_id)
        if rollout is None or rollout.in_flight:
            return False
        del self._by_id[rollout_id]
        return True

    def get(self, rollout_id: str) -> Rollout:
        rollout = self._by_id.get(rollout_id)
        if rollout is None:
            raise RolloutNotFound(f"rollout {rollout_id!r} is not registered with this gateway")
        return rollout

    def open(self, rollout_id: str) -> Rollout:
        rollout = self.get(rollout_id)
        if rollout.sealed:
            raise RolloutAlreadySealed(f"rollout {rollout_id!r} is sealed: it takes no more calls")
        return rollout

    def begin_call(self, rollout: Rollout) -> int:
        """Reserve the call's seq; the rollout cannot be sealed until `end_call`."""
        seq = rollout.next_seq
        rollout.next_seq += 1
        rollout.in_flight += 1
        rollout.idle.clear()
        return seq

    def end_call(self, rollout: Rollout, acknowledged: list[str]) -> None:
        """`acknowledged`: the call's events Kafka acknowledged (one per choice; none if it was not stored)."""
        rollout.acknowledged += acknowledged
        rollout.in_flight -= 1
        if rollout.in_flight == 0:
            rollout.idle.set()

    def remember_tip(self, rollout: Rollout, tip: Tip) -> None:
        if self.max_tips:
            rollout.tips.append(tip)

    def remember_turn(self, rollout: Rollout, key: str, token_ids: list[int]) -> None:
        if rollout.n_turns < self.max_turns:
            rollout.turns.setdefault(key, []).append(token_ids)
            rollout.n_turns += 1

    async def seal(self, rollout_id: str) -> Rollout:
        """Close the rollout and wait for its calls in flight; idempotent."""
        rollout = self.get(rollout_id)
        self._mark_sealed(rollout)
        await rollout.idle.wait()
        rollout.turns.clear()
        rollout.answers.clear()
        rollout.tips.clear()
        rollout.rendered = None
        return rollout

    def _mark_sealed(self, rollout: Rollout) -> None:
        if not rollout.sealed:
            rollout.sealed = True
            self._sealed.append(rollout.rollout_id)
            while len(self._sealed) > self.max_sealed:
                self._by_id.pop(self._sealed.popleft(), None)

    def __len__(self) -> int:
        return len(self._by_id)

    def __iter__(self) -> Iterator[Rollout]:
        return iter(self._by_id.values())
