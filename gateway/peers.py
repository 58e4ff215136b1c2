"""Other replicas' writes to rollouts this process holds: the cue to read those rollouts back from the log.

Replicas share no memory; each holds the rollouts it served as a cache of the
log. When a rollout moves (its replica died, or a load balancer sent a call
elsewhere) and comes back, the cache is stale: another replica gave out seqs
and produced turns. This watcher follows tether.calls from its end, decodes
only records keyed by a rollout this process holds, and forgets the rollout
when another gateway wrote a call for it or someone else sealed it; its next
call restores it from the log. The window in which a stale cache can be used
is this watcher's lag behind the log (milliseconds on a healthy cluster).
This process's own calls are known by where Kafka acknowledged them
(`OwnWrites`) and passed over undecoded. While no other gateway of the run is
alive (`Company`, from tether.control) the watcher reads the topic in a batch
every `ALONE_READ_S` instead of as it is written: following it cost a lone
gateway a fetch answered and the next one sent for each of its own calls, about
half a millisecond a call at one client. Every record is still read, so a
gateway writing while invisible on tether.control (its control loop dead, say)
is noticed within that second.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from aiokafka import TopicPartition

from gateway.company import Company
from gateway.metrics import Metrics
from gateway.own_writes import OwnWrites
from gateway.rollouts import Rollouts
from schemas import topics
from schemas.consumer import CaughtUp, EventConsumer, Record
from schemas.errors import BusError
from schemas.events import Event, ModelCall, RolloutSealed
from schemas.producer import EventProducer
from schemas.settings import BusSettings

log = logging.getLogger("tether.gateway.peers")

ALONE_READ_S = 1.0


class PeerWatch:
    def __init__(self, *, bus: BusSettings, gateway_id: str, rollouts: Rollouts, own: OwnWrites,
                 producer: EventProducer, metrics: Metrics, company: Company,
                 clock: Callable[[], float] = time.time) -> None:
        self.gateway_id, self.rollouts, self.own, self.metrics = gateway_id, rollouts, own, metrics
        self.company, self._clock = company, clock
        self._consumer = EventConsumer(bus, [topics.CALLS], producer, from_beginning=False,
                                       name=f"gateway-{gateway_id}-peers")
        self.ready = asyncio.Event()  # positioned at the end of tether.calls: nothing written after is missed
        self._following = True  # reading records as they are written (else once a second, alone)
        self._paused = False  # alone, between two reads
        self._next_read = 0.0  # alone: when the paused watcher reads what was written since
        self._drain_to: dict[TopicPartition, int] | None = None  # alone: read up to here, then pause

    def wanted(self, record: Record) -> bool:
        """A record for a rollout held here, not written by this process."""
        key = record.key
        return key is not None and self.rollouts.find(key.decode(errors="replace")) is not None \
            and not self.own.pop(record.partition, record.offset)

    async def run(self) -> None:
        self.metrics.peer_watch.set(1)
        async with self._consumer as consumer:
            async for batch in consumer.follow_batches(timeout_ms=100, wanted=self.wanted):
                if isinstance(batch, CaughtUp):
                    self.ready.set()
                    continue
                for item in batch:
                    self._read(item.event)
                if self.ready.is_set():
                    await self._mind(consumer)

    def _read(self, event: Event) -> None:
        if isinstance(event, ModelCall) and event.gateway_id != self.gateway_id:
            self._forget(event.rollout_id, f"gateway {event.gateway_id} served call {event.seq}")
        elif isinstance(event, RolloutSealed):
            held = self.rollouts.find(event.rollout_id)
            if held is not None and not held.sealed:
                self._forget(event.rollout_id, "it was sealed elsewhere")

    async def _mind(self, consumer: EventConsumer) -> None:
        """Alone: read up to the end as it was, pause, and do it again `ALONE_READ_S` later. Not alone: follow."""
        now = self._clock()
        try:
            if not self.company.alone(now):
                self._follow(consumer, "another gateway of the run is alive")
            elif self._paused:
                if now >= self._next_read:
                    consumer.resume()
                    self._paused = False
            else:
                if self._drain_to is None:
                    self._drain_to = await consumer.end_offsets()
                if all([await consumer.position(tp) >= end for tp, end in self._drain_to.items()]):
                    consumer.pause()
                    self._paused, self._drain_to, self._next_read = True, None, now + ALONE_READ_S
                    if self._following:
                        self._following = False
                        self.metrics.peer_watch.set(0)
                        log.info("no other gateway of the run is alive: tether.calls is read once a second")
        except BusError as exc:  # back to the way that needs no more than the fetch itself
            log.warning("the peer watcher could not find the end of tether.calls: %s", exc)
            self._follow(consumer, "after that failure")

    def _follow(self, consumer: EventConsumer, why: str) -> None:
        if self._paused:
            consumer.resume()
        self._paused, self._drain_to = False, None
        if not self._following:
            self._following = True
            self.metrics.peer_watch.set(1)
            log.info("%s: tether.calls is followed as it is written", why)

    def _forget(self, rollout_id: str, why: str) -> None:
        if self.rollouts.forget(rollout_id):
            self.metrics.forgotten.inc()
            log.info("forgot rollout %s (%s): its next call reads it back from the log", rollout_id, why)
