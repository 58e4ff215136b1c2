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
(`OwnWrites`) and passed over undecoded. While no other gateway is alive
(`Company`, from tether.control) the watcher reads everything written until
then and stops fetching: a fetch answered for each of its own calls and the
next one sent cost a lone gateway about half a millisecond a call at one
client. When another joins, it reads on from `READ_BACK_S` before that one's
first GatewayJoined: its calls come after it, and the minute covers clocks
that disagree (a topic stamped at append takes the broker's) and a gateway
written off while still writing, which joins again as soon as it reads that.
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
from schemas.events import ModelCall, RolloutSealed
from schemas.producer import EventProducer
from schemas.settings import BusSettings

log = logging.getLogger("tether.gateway.peers")

READ_BACK_S = 60.0


class PeerWatch:
    def __init__(self, *, bus: BusSettings, gateway_id: str, rollouts: Rollouts, own: OwnWrites,
                 producer: EventProducer, metrics: Metrics, company: Company,
                 clock: Callable[[], float] = time.time) -> None:
        self.gateway_id, self.rollouts, self.own, self.metrics = gateway_id, rollouts, own, metrics
        self.company, self._clock = company, clock
        self._consumer = EventConsumer(bus, [topics.CALLS], producer, from_beginning=False,
                                       name=f"gateway-{gateway_id}-peers")
        self.ready = asyncio.Event()  # positioned at the end of tether.calls: nothing written after is missed
        self._paused = False
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

    def _read(self, event: object) -> None:
        if isinstance(event, ModelCall) and event.gateway_id != self.gateway_id:
            self._forget(event.rollout_id, f"gateway {event.gateway_id} served call {event.seq}")
        elif isinstance(event, RolloutSealed):
            held = self.rollouts.find(event.rollout_id)
            if held is not None and not held.sealed:
                self._forget(event.rollout_id, "it was sealed elsewhere")

    async def _mind(self, consumer: EventConsumer) -> None:
        """Alone: read what is written so far, then stop fetching. Joined by another: read on from before it."""
        now = self._clock()
        if not self._paused:
            if not self.company.alone(now):
                self._drain_to = None
            elif self._drain_to is None:
                self._drain_to = await consumer.end_offsets()
            elif all([await consumer.position(tp) >= end for tp, end in self._drain_to.items()]):
                consumer.pause()
                self._paused, self._drain_to = True, None
                self.metrics.peer_watch.set(0)
                log.info("no other gateway is alive: tether.calls is not followed until one joins")
            return
        since = self.company.arrived_since(now)
        if since is None:
            return
        start_ms = int((since - READ_BACK_S) * 1000)
        for tp in consumer.assignment():
            await consumer.seek_to_time(tp, start_ms)
        consumer.resume()
        self._paused = False
        self.metrics.peer_watch.set(1)
        log.info("another gateway is alive: tether.calls followed again, from %.0f s back (%.0f s before its "
                 "first join)", now - since + READ_BACK_S, READ_BACK_S)

    def _forget(self, rollout_id: str, why: str) -> None:
        if self.rollouts.forget(rollout_id):
            self.metrics.forgotten.inc()
            log.info("forgot rollout %s (%s): its next call reads it back from the log", rollout_id, why)
