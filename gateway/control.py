"""The gateway's side of tether.control: pause on UpdateRequested, report the drain, resume on a new version.

On start it reads the run's control history to learn the current weight
version and whether an update is pending (then it pauses at once), announces
itself with GatewayJoined, and follows new events; on stop it says
GatewayLeft, so the trainer stops waiting for it. A gateway killed says
nothing, so GatewayJoined is repeated every `heartbeat_s` as a lease: the
trainer writes off a member silent past its lease (with a GatewayLeft on its
behalf) instead of holding every other gateway's calls until its drain
timeout. A gateway that reads itself written off while alive (it was cut off
from Kafka) joins again, and drains again if an update is pending.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from gateway.company import Company
from gateway.gate import Gate
from gateway.metrics import Metrics
from schemas import topics
from schemas.consumer import CaughtUp, EventConsumer
from schemas.errors import BusError
from schemas.events import (
    GatewayDrained,
    GatewayJoined,
    GatewayLeft,
    UpdateAborted,
    UpdateRequested,
    WeightVersionPublished,
    run_of,
)
from schemas.producer import EventProducer
from schemas.settings import BusSettings

log = logging.getLogger("tether.gateway.control")


class ControlLoop:
    def __init__(self, *, bus: BusSettings, run_id: str, gateway_id: str, url: str, gate: Gate,
                 producer: EventProducer, metrics: Metrics, on_version: Callable[[int, bool], None],
                 heartbeat_s: float, company: Company) -> None:
        self.bus, self.run_id, self.gateway_id, self.url = bus, run_id, gateway_id, url
        self.company = company  # the run's other gateways, as their joins and leaves are read here
        self.heartbeat_s = heartbeat_s
        self.gate, self.producer, self.metrics = gate, producer, metrics
        self.on_version = on_version
        self.version = 0
        self._drain: asyncio.Task[None] | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        self._leaving = False
        self._consumer = EventConsumer(bus, [topics.CONTROL], producer, name=f"gateway-{gateway_id}")
        self.ready = asyncio.Event()

    async def run(self) -> None:
        try:
            await self._follow()
        finally:
            if self._heartbeat is not None:
                self._heartbeat.cancel()

    async def _follow(self) -> None:
        async with self._consumer as consumer:
            pending: int | None = None
            caught_up = False
            async for item in consumer.follow():
                if isinstance(item, CaughtUp):
                    caught_up = True
                    self.company.history_read()
                    if pending is not None:
                        self._pause(pending)
                    await self._joined()
                    continue
                event = item.event
                if run_of(event) != self.run_id:
                    continue
                if isinstance(event, GatewayJoined):
                    self.company.joined(event.gateway_id, event.joined_at.timestamp(),
                                        time.time() if caught_up else None)
                elif isinstance(event, GatewayLeft):
                    self.company.left(event.gateway_id)
                if isinstance(event, UpdateRequested):
                    pending = event.version
                    if caught_up:
                        self._pause(event.version)
                elif isinstance(event, GatewayLeft) and event.gateway_id == self.gateway_id and caught_up \
                        and not self._leaving:
                    log.warning("written off by another (%s) while alive: joining again", event.reason)
                    await self._announce()
                    if pending is not None and self.gate.paused_for == pending:
                        self._pause(pending)  # its drain may not have been counted: report it again
                elif isinstance(event, WeightVersionPublished | UpdateAborted):
                    if isinstance(event, WeightVersionPublished):
                        self.version = event.version
                        self.on_version(event.version, event.adapter)
                        self.metrics.weight_version.set(event.version)
                    pending = None
                    if caught_up:
                        self._resume()

    async def _joined(self) -> None:
        await self._announce()
        log.info("gateway %s joined run %s at weight version %d", self.gateway_id, self.run_id, self.version)
        self.ready.set()
        self._heartbeat = asyncio.create_task(self._beat())

    async def _announce(self) -> None:
        await self.producer.publish(GatewayJoined(run_id=self.run_id, gateway_id=self.gateway_id, url=self.url))

    async def _beat(self) -> None:
        """GatewayJoined again every heartbeat: the lease that tells the trainer this gateway is alive."""
        while True:
            await asyncio.sleep(self.heartbeat_s)
            try:
                await self._announce()
            except BusError as exc:  # Kafka away: the next beat tries again; the lease is long enough for some
                log.warning("could not send the heartbeat: %s", exc)

    def _pause(self, version: int) -> None:
        log.info("pausing for weight version %d", version)
        self.gate.pause(version)
        if self._drain is not None and not self._drain.done():
            self._drain.cancel()  # each UpdateRequested gets its own GatewayDrained
        self._drain = asyncio.create_task(self._report_drained(version))

    async def _report_drained(self, version: int) -> None:
        await self.gate.drained()
        while self.gate.paused_for == version:
            try:
                await self.producer.publish(GatewayDrained(run_id=self.run_id, version=version,
                                                           gateway_id=self.gateway_id, held_calls=self.gate.held))
            except BusError as exc:  # the trainer waits for this: keep trying while the pause lasts
                log.warning("could not report the drain for version %d: %s", version, exc)
                await asyncio.sleep(1.0)
                continue
            log.info("drained for version %d with %d calls held", version, self.gate.held)
            return

    def _resume(self) -> None:
        log.info("resuming at weight version %d", self.version)
        if self._drain is not None and not self._drain.done():
            self._drain.cancel()
        self.gate.resume()

    async def leave(self, reason: str) -> None:
        self._leaving = True
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        with contextlib.suppress(Exception):  # best effort on the way out
            await self.producer.publish(GatewayLeft(run_id=self.run_id, gateway_id=self.gateway_id, reason=reason))
