"""A rollout's state at the gateway, rebuilt from the log: what lets any replica, or a restarted gateway, serve
a rollout it never saw.

The gateway keeps a rollout's call order, acknowledged calls, seal and own
turns in memory, but every part of it is on the topics: `RolloutStarted` on
tether.rollouts says the rollout exists, each `ModelCall` on tether.calls
carries its seq, its call id, and the exact ids and `turn_key` of the turn it
produced (with the call it extends: `schemas.calls` makes it whole), and
`RolloutSealed` closes it. Both topics are keyed by rollout id,
so one partition of each holds a rollout's whole history; a reader starts at
the time the rollout could have begun (`since`) and reads to the end offsets
taken when it starts, which every call any replica has acknowledged is below.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from aiokafka import TopicPartition

from gateway.api.responses.protocol import RESPONSES, stored_id
from gateway.extends import Tip, tip
from schemas import topics
from schemas.calls import MissingCall, Wholes
from schemas.consumer import EventConsumer
from schemas.events import Event, ModelCall, RolloutSealed, RolloutStarted
from schemas.producer import EventProducer
from schemas.settings import BusSettings


@dataclass(kw_only=True)
class Recovered:
    """What the log says of one rollout."""

    run_id: str
    next_seq: int = 0
    acknowledged: list[str] = field(default_factory=list)  # call ids in the order the log holds them
    sealed: bool = False
    turns: list[tuple[str, list[int]]] = field(default_factory=list)  # (turn_key, exact ids), in call order
    answers: dict[str, tuple[str, str]] = field(default_factory=dict)  # kept answers: id → (request, response)
    tips: list[Tip] = field(default_factory=list)  # acknowledged answers a new call may extend, oldest first


def fold(rollout_id: str, history: Iterable[Event], tips: int = 4, whole: bool = True) -> Recovered | None:
    """The rollout's state from its events in log order, with its latest `tips` answers as tips; None if the log
    does not know it. `whole`: False reads only its calls' ids and seqs and whether it is sealed (what sealing
    needs), without making each call whole again (a cost that grows with the square of its calls). Pure."""
    state: Recovered | None = None
    turns: list[tuple[int, int, str, list[int]]] = []
    wholes = Wholes()
    answered: deque[ModelCall] = deque(maxlen=tips)
    for event in history:
        if not isinstance(event, RolloutStarted | ModelCall | RolloutSealed) or event.rollout_id != rollout_id:
            continue
        state = state or Recovered(run_id=event.run_id)
        if state.sealed:
            continue  # the seal listed the rollout's calls: a call stored after it is not part of it
        if isinstance(event, ModelCall):
            state.next_seq = max(state.next_seq, event.seq + 1)
            if event.call_id not in state.acknowledged:
                state.acknowledged.append(event.call_id)
            if not whole:
                continue
            try:
                event = wholes.add(event)
            except MissingCall:
                pass  # what it extends is not on the log: it cannot be extended in turn, nor its answer kept
            else:
                if event.status == "ok":
                    answered.append(event)
            if event.status == "ok" and event.turn_key is not None:
                turns.append((event.seq, event.choice_index, event.turn_key, event.response_token_ids))
            kept = (stored_id(event.response_json) if event.status == "ok" and event.api == RESPONSES
                    and event.extends is None else None)
            if kept is not None:
                state.answers[kept] = (event.request_json, event.response_json)
        elif isinstance(event, RolloutSealed):
            state.sealed = True
            state.acknowledged = list(event.call_ids)  # the seal is the rollout's record
    if state is not None:
        state.turns = [(key, ids) for _, _, key, ids in sorted(turns, key=lambda t: (t[0], t[1]))]
        if not state.sealed:
            state.tips = [tip(c.call_id, c.prompt_token_ids, c.response_token_ids, c.request_json) for c in answered]
    return state


class RolloutReader:
    """Reads one rollout's events from its partitions of tether.rollouts and tether.calls."""

    def __init__(self, bus: BusSettings, deadletters: EventProducer, *, window_s: float, name: str,
                 tips: int = 4) -> None:
        self.bus, self.deadletters, self.window_s, self.name, self.tips = bus, deadletters, window_s, name, tips
        self._closing: set[asyncio.Task[None]] = set()

    async def read(self, rollout_id: str, since: float | None = None, whole: bool = True) -> Recovered | None:
        """The rollout as the log holds it now. `since`: when it could have started at the earliest (epoch
        seconds); without it, `window_s` back from now. `whole`: as `fold`'s."""
        key = rollout_id.encode()
        start_ms = int(((since if since is not None else time.time() - self.window_s) - 60) * 1000)
        partitions = [TopicPartition(t.name, topics.partition_for(key, t.partitions))
                      for t in (topics.ROLLOUTS, topics.CALLS)]
        consumer = EventConsumer(self.bus, [], self.deadletters, name=self.name)
        await consumer.start()
        try:
            consumer.assign(partitions)
            for tp in partitions:
                await consumer.seek_to_time(tp, max(start_ms, 0))
            found = [r.event async for r in consumer.read_to_end(timeout_ms=100, wanted=lambda r: r.key == key)]
        finally:
            self._close_later(consumer)
        return fold(rollout_id, found, self.tips, whole)

    def _close_later(self, consumer: EventConsumer) -> None:
        """Closed off the call's path: under uvloop, closing TLS connections waits for the brokers' close_notify,
        which does not come, until uvloop's 30 s shutdown timeout (every restore took 31 s on a secured cluster)."""
        task = asyncio.create_task(consumer.stop())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
