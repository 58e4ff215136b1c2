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
(`OwnWrites`) and passed over undecoded, so the watcher costs a replica almost
nothing for the rollouts it serves alone.
"""

from __future__ import annotations

import asyncio
import logging

from gateway.metrics import Metrics
from gateway.own_writes import OwnWrites
from gateway.rollouts import Rollouts
from schemas import topics
from schemas.consumer import CaughtUp, EventConsumer, Record
from schemas.events import ModelCall, RolloutSealed
from schemas.producer import EventProducer
from schemas.settings import BusSettings

log = logging.getLogger("tether.gateway.peers")


class PeerWatch:
    def __init__(self, *, bus: BusSettings, gateway_id: str, rollouts: Rollouts, own: OwnWrites,
                 producer: EventProducer, metrics: Metrics) -> None:
        self.gateway_id, self.rollouts, self.own, self.metrics = gateway_id, rollouts, own, metrics
        self._consumer = EventConsumer(bus, [topics.CALLS], producer, from_beginning=False,
                                       name=f"gateway-{gateway_id}-peers")
        self.ready = asyncio.Event()  # positioned at the end of tether.calls: nothing written after is missed

    def wanted(self, record: Record) -> bool:
        """A record for a rollout held here, not written by this process."""
        key = record.key
        return key is not None and self.rollouts.find(key.decode(errors="replace")) is not None \
            and not self.own.pop(record.partition, record.offset)

    async def run(self) -> None:
        async with self._consumer as consumer:
            async for item in consumer.follow(timeout_ms=100, wanted=self.wanted):
                if isinstance(item, CaughtUp):
                    self.ready.set()
                    continue
                event = item.event
                if isinstance(event, ModelCall) and event.gateway_id != self.gateway_id:
                    self._forget(event.rollout_id, f"gateway {event.gateway_id} served call {event.seq}")
                elif isinstance(event, RolloutSealed):
                    held = self.rollouts.find(event.rollout_id)
                    if held is not None and not held.sealed:
                        self._forget(event.rollout_id, "it was sealed elsewhere")

    def _forget(self, rollout_id: str, why: str) -> None:
        if self.rollouts.forget(rollout_id):
            self.metrics.forgotten.inc()
            log.info("forgot rollout %s (%s): its next call reads it back from the log", rollout_id, why)
