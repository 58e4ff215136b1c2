"""Where the join keeps the calls of rollouts still open, apart from their state, one entry per call.

Writing a call costs the size of the call. `MemoryCalls` holds them for a
replay. `CachedCalls` is the live join's: tether.calls already keeps every
call, keyed and ordered by rollout, so the processors write them nowhere
else; the cache holds what this worker has read, within a budget of bytes, and
`read_back` fetches from the log what it lacks: calls read before a restart
or a rebalance, or evicted.
"""

from __future__ import annotations

import asyncio
from array import array
from collections import OrderedDict
from typing import Protocol

from aiokafka import TopicPartition

from schemas import topics
from schemas.consumer import EventConsumer
from schemas.events import Event, ModelCall
from schemas.producer import Delivery
from schemas.settings import BusSettings
from stream_processors.assembly import Call

#: how far before a rollout's start its first call can be stamped (the controller's and gateway's clocks)
CLOCK_SKEW_S = 60.0


class CallStore(Protocol):
    def add(self, rollout_id: str, call: Call) -> None: ...

    def of(self, rollout_id: str) -> dict[str, Call]:
        """The rollout's calls held, by call id (empty if none)."""
        ...

    def forget(self, rollout_id: str) -> None: ...


class MemoryCalls:
    def __init__(self) -> None:
        self._calls: dict[str, dict[str, Call]] = {}

    def add(self, rollout_id: str, call: Call) -> None:
        self._calls.setdefault(rollout_id, {}).setdefault(call.call_id, call)

    def of(self, rollout_id: str) -> dict[str, Call]:
        return self._calls.get(rollout_id, {})

    def forget(self, rollout_id: str) -> None:
        self._calls.pop(rollout_id, None)


def _size(call: Call) -> int:
    return 4 * (len(call.prompt_token_ids) + 2 * len(call.response_token_ids)) + 200


class CachedCalls:
    """Calls by rollout, numbers packed as arrays (4 bytes a token rather than a list's 36), the least recently
    added rollout evicted first once `max_bytes` is passed."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self.evicted = 0  # rollouts
        self._calls: OrderedDict[str, dict[str, Call]] = OrderedDict()

    def add(self, rollout_id: str, call: Call) -> None:
        held = self._calls.setdefault(rollout_id, {})
        self._calls.move_to_end(rollout_id)
        if call.call_id in held:
            return
        held[call.call_id] = Call(call.call_id, call.seq, call.choice_index, array("i", call.prompt_token_ids),
                                  array("i", call.response_token_ids), array("f", call.response_logprobs),
                                  call.weight_version, call.ok, call.extends)
        self.bytes += _size(call)
        while self.bytes > self.max_bytes and len(self._calls) > 1:
            _, dropped = self._calls.popitem(last=False)
            self.bytes -= sum(map(_size, dropped.values()))
            self.evicted += 1

    def of(self, rollout_id: str) -> dict[str, Call]:
        return self._calls.get(rollout_id, {})

    def forget(self, rollout_id: str) -> None:
        self.bytes -= sum(map(_size, self._calls.pop(rollout_id, {}).values()))

    def __len__(self) -> int:
        return len(self._calls)


class _AlreadyReported:
    """Dead letters of a read-back: the join reported each bad record when it first read it."""

    async def publish(self, event: Event) -> Delivery:
        return Delivery(topics.DEADLETTER.name, -1, -1)


async def read_back(bus: BusSettings, rollout_id: str, *, first_call: int | None, started_at: float | None,
                    name: str) -> list[ModelCall]:
    """The rollout's calls on tether.calls, from its first (or from its start, less the clocks' skew, where the
    first is not known; else from the beginning) to the end of its partition now."""
    key = rollout_id.encode()
    tp = TopicPartition(topics.CALLS.name, topics.partition_for(key, topics.CALLS.partitions))
    consumer = EventConsumer(bus, [], _AlreadyReported(), name=name)
    await consumer.start()
    try:
        consumer.assign([tp])
        if first_call is not None:
            consumer.seek(tp, first_call)
        elif started_at is not None:
            await consumer.seek_to_time(tp, max(0, int((started_at - CLOCK_SKEW_S) * 1000)))
        else:
            consumer.seek(tp, 0)
        found = [r.event async for r in consumer.read_to_end(timeout_ms=100, wanted=lambda r: r.key == key)]
    finally:
        # Closed off the stream's path: under uvloop, closing TLS connections waits for a close_notify the
        # brokers do not send (gateway.readback found it).
        closing = asyncio.create_task(consumer.stop())
        _closing.add(closing)
        closing.add_done_callback(_closing.discard)
    return [e for e in found if isinstance(e, ModelCall)]


_closing: set[asyncio.Task[None]] = set()

