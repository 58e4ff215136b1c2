"""The processors' agents over one Faust app: join, group, time out partial groups, sink to analytics.

    tether.calls + tether.rollouts ──join──► <app>-complete (keyed by group) ──group──► tether.samples
        (table: rollouts; calls cached,                            (table: groups; timer: partial groups)
         read back from tether.calls)
    calls, rollouts, samples, control ──sink──► ClickHouse

The decisions are the pure steps of `pipeline`, `join` and `grouping`; this
module only moves records between topics, tables and those steps. A record no
reader accepts is dead-lettered once, by the first agent that reads its topic,
as `schemas.deadletters.accept` decides.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, replace
from typing import Any

import faust

from analytics.errors import AnalyticsError
from analytics.sink import Sink, connect
from schemas import topics
from schemas.deadletters import Rejection, accept
from schemas.errors import BusError
from schemas.events import Event, ModelCall, TaskGroup, rollout_of, run_of
from schemas.serde import encode
from schemas.topics import key_for
from stream_processors.call_store import CachedCalls, read_back
from stream_processors.grouping import GroupState, Policy, build
from stream_processors.join import CompleteRollout, RolloutJoin, call_of
from stream_processors.pipeline import completed, group_step, rollout_step
from stream_processors.settings import ProcessorSettings

log = logging.getLogger("tether.processors")

RAW: dict[str, Any] = {"key_type": bytes, "value_type": bytes, "key_serializer": "raw", "value_serializer": "raw"}
JOINED = frozenset({topics.CALLS.name, topics.ROLLOUTS.name})  # the join agent reports their bad records


@dataclass
class Counters:
    """What the processors did since they started; logged on the timer whenever it changed."""
    dead_lettered: int = 0
    groups: int = 0
    sink_failures: int = 0
    read_back: int = 0  # rollouts whose calls were read back from tether.calls (after a restart or rebalance)


class Processors:
    """The topics, tables and agents of one processor app; `create_app` registers the agents."""

    def __init__(self, app: faust.App, settings: ProcessorSettings) -> None:
        self.settings = settings
        self.policy = Policy(settings.failed, settings.fill_reward)
        self.sources = app.topic(topics.CALLS.name, topics.ROLLOUTS.name, **RAW)
        self.complete = app.topic(f"{settings.app_id}-complete", partitions=topics.SAMPLES.partitions,
                                  internal=True, **RAW)
        self.analytics = app.topic(topics.CALLS.name, topics.ROLLOUTS.name, topics.SAMPLES.name,
                                   topics.CONTROL.name, **RAW)
        self.samples = app.topic(topics.SAMPLES.name, **RAW)
        self.deadletters = app.topic(topics.DEADLETTER.name, **RAW)
        # Written after each batch of the join, not within one event: its changelog partition comes from the key
        # (murmur2, as the producers of tether.calls and tether.rollouts place the rollout), as for `groups`.
        self.rollouts = app.Table("rollouts", key_type=bytes, value_type=bytes, partitions=topics.CALLS.partitions,
                                  use_partitioner=True)
        # The timer changes this table too, outside any stream's event, where Faust cannot take the partition from
        # the event and refuses ("Cannot modify table key from outside of stream iteration": the processors
        # crashed so in CI). Its changelog partition comes from the key instead, murmur2 like the producer
        # that keys `-complete` by group id, so a group's changelog partition stays its source partition.
        self.groups = app.Table("groups", key_type=bytes, value_type=bytes, partitions=topics.SAMPLES.partitions,
                                use_partitioner=True)
        self.calls = CachedCalls(settings.call_cache_mb * 1024 * 1024)
        self._read_back: set[str] = set()  # rollouts read back since this worker started: once is enough
        self.app = app
        self.counters = Counters()
        self._reported = Counters()

    def wanted(self, event: Event) -> bool:
        return not self.settings.run_id or run_of(event) == self.settings.run_id

    async def accept(self, event: faust.EventT[bytes], agent: str, report: bool = True) -> Event | None:
        """The decoded event, or None after sending the record to the dead letters (when `report`)."""
        message = event.message
        decided = accept(event.value, message.topic)
        if not isinstance(decided, Rejection):
            return decided
        if report:
            dead = decided.letter(topic=message.topic, partition=message.partition, offset=message.offset,
                                  key=event.key, value=event.value, consumer=f"{self.settings.app_id}.{agent}")
            await (await self.deadletters.send(key=key_for(dead), value=encode(dead)))
            self.counters.dead_lettered += 1
            log.warning("dead-lettered %s[%d]@%d: %s", message.topic, message.partition, message.offset,
                        decided.reason)
        return None

    async def join(self, stream: faust.StreamT[bytes]) -> None:
        """Calls and rollout events into one state per rollout, calls kept apart; a complete rollout goes on to its
        group. Events are taken in batches: the batch's complete rollouts are sent together, and once Kafka holds
        them all, the states that changed (on lifecycle events and a rollout's first call, not on every call) are
        written, so a rollout is never marked done before its record is stored."""
        batches = stream.take_events(self.settings.join_batch,  # type: ignore[attr-defined]
                                     within=self.settings.join_batch_s)
        async for batch in batches:
            joins: dict[str, RolloutJoin] = {}
            changed: set[str] = set()
            results: list[CompleteRollout] = []
            for event in batch:
                decoded = await self.accept(event, "join")
                rid = rollout_of(decoded) if decoded is not None and self.wanted(decoded) else None
                if decoded is None or rid is None:
                    continue
                joined = joins.get(rid) or self._join_of(rid)
                joins[rid] = joined
                offset = event.message.offset if isinstance(decoded, ModelCall) else None
                step_changed, result = rollout_step(joined, self.calls, decoded, offset)
                if result is None and joined.waiting_for_calls and rid not in self._read_back:
                    result = await self._recover(joined)
                if step_changed or result is not None:
                    changed.add(rid)
                if result is not None:
                    self._read_back.discard(rid)
                    results.append(result)
            sent = [await self.complete.send(key=r.group_id.encode(), value=r.dumps()) for r in results]
            await asyncio.gather(*sent)
            for rid in changed:
                self.rollouts[rid.encode()] = joins[rid].dumps()

    def _join_of(self, rid: str) -> RolloutJoin:
        state = self.rollouts.get(rid.encode())
        return RolloutJoin.loads(state) if state is not None else RolloutJoin(rid)

    async def _recover(self, joined: RolloutJoin) -> CompleteRollout | None:
        """A rollout that lacks only calls: those read before a restart or a rebalance, or evicted from the
        cache, are on tether.calls. Read once per worker: a sealed call still missing then was never stored
        (its group goes out partial when it times out)."""
        rid = joined.rollout_id
        self._read_back.add(rid)
        started = joined.started or {}
        try:
            found = await read_back(self.settings.bus, rid, first_call=joined.first_call,
                                    started_at=started.get("started_at"), name=f"{self.settings.app_id}-read-back")
        except BusError as exc:
            self._read_back.discard(rid)  # the next event of the rollout tries again
            log.error("rollout %s: its calls could not be read back from tether.calls: %s", rid, exc)
            return None
        self.counters.read_back += 1
        for call in found:
            self.calls.add(rid, call_of(call))
        log.info("rollout %s: %d calls read back from tether.calls", rid, len(found))
        result = completed(joined, self.calls)
        if result is None and not joined.done:  # (done with nothing: a validation rollout, never a sample)
            log.warning("rollout %s is sealed and finished, but %d of its sealed calls are not on tether.calls",
                        rid, len(joined.missing(self.calls.of(rid))))
        return result

    async def group(self, stream: faust.StreamT[bytes]) -> None:
        """Complete rollouts into task groups; a group goes out once, then only its marker stays. Taken in batches
        as the join's are: one wait for Kafka's acknowledgements per batch, not per group (that wait bounded the
        groups per second), and the states written once their groups are stored."""
        batches = stream.take_events(self.settings.join_batch,  # type: ignore[attr-defined]
                                     within=self.settings.join_batch_s)
        async for batch in batches:
            states: dict[bytes, GroupState] = {}
            ready: list[tuple[bytes, TaskGroup]] = []
            for event in batch:
                gid, rollout = event.key, CompleteRollout.loads(event.value)
                current = states.get(gid) or self._group_of(gid)
                states[gid] = current
                if (group := group_step(current, rollout, self.policy, event.value)) is not None:
                    ready.append((gid, group))
                    current.clear()
            await self._emit_all(ready)
            for gid, current in states.items():
                self.groups[gid] = current.dumps()

    def _group_of(self, gid: bytes) -> GroupState:
        state = self.groups.get(gid)
        return GroupState.loads(state) if state is not None else GroupState(gid.decode(), time.time())

    async def tick(self) -> None:
        """The timer: partial groups out, counters to the log."""
        await self.partial_groups()
        if self.counters != self._reported:
            log.info("processors: %s", self.counters)
            self._reported = replace(self.counters)

    async def partial_groups(self) -> None:
        """A group that waited past the timeout goes out with the rollouts it has. Only groups of partitions this
        worker holds now: the in-memory table keeps those it held before a rebalance, whose groups are another's."""
        now = time.time()
        held = {tp.partition for tp in self.app.consumer.assignment() if tp.topic == self.complete.get_topic_name()}
        for gid, state in list(self.groups.items()):
            if topics.partition_for(gid, topics.SAMPLES.partitions) not in held:
                continue
            current = GroupState.loads(state)
            if current.emitted or now - current.first_seen < self.settings.group_timeout_s or not current.rollouts:
                continue
            await self._emit_all([(gid, build(current.members(), self.policy, partial=True))])
            current.emitted = True
            current.clear()
            self.groups[gid] = current.dumps()
            log.warning("task group %s timed out: published partial", gid.decode())

    async def sink(self, stream: faust.StreamT[bytes]) -> None:
        """Analytics must never stop the training data: a ClickHouse failure is logged and the sink goes on
        (the tables can be rebuilt from the topics)."""
        dsn = self.settings.clickhouse_dsn
        assert dsn, "the sink agent runs only with a DSN"
        writer: Sink | None = None
        batches = stream.take_events(self.settings.sink_batch,  # type: ignore[attr-defined]
                                     within=self.settings.sink_flush_s)
        async for batch in batches:
            try:
                writer = writer or Sink(await asyncio.to_thread(connect, dsn))
            except AnalyticsError as exc:
                log.error("analytics sink: %s", exc)
                continue
            for event in batch:
                decoded = await self.accept(event, "sink", report=event.message.topic not in JOINED)
                if decoded is not None and self.wanted(decoded):
                    writer.add(decoded)
            try:
                await asyncio.to_thread(writer.flush)
            except AnalyticsError as exc:
                self.counters.sink_failures += 1
                log.error("analytics sink: %s; %d rows not written", exc, sum(map(len, writer.pending.values())))
                writer.pending.clear()

    async def _emit_all(self, groups: list[tuple[bytes, TaskGroup]]) -> None:
        """Send them all, then wait until Kafka holds every one."""
        sent = [await self.samples.send(key=gid, value=encode(group)) for gid, group in groups]
        await asyncio.gather(*sent)
        self.counters.groups += len(groups)
