"""The Faust application: join calls to rollouts, group rollouts by task, sink everything into ClickHouse.

    tether.calls + tether.rollouts ──join──► <app>-complete (keyed by group) ──group──► tether.samples
                 (table: rollouts)                                 (table: groups; timer: partial groups)
    calls, rollouts, samples, control ──sink──► ClickHouse

Tables live in memory and are restored from their changelog topics on start.
Delivery is at least once; exactly-once *results* come from determinism:
a task group's id is its task's, its content depends only on its rollouts,
the groups table marks it emitted, and readers of tether.samples keep the
first record per group id (`schemas.samples.unique_groups`). A processor killed
between publishing a group and recording that can publish it again,
byte for byte the same, and readers drop the copy.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import faust

from schemas import topics
from schemas.errors import DecodeError
from schemas.events import DeadLetter, Event
from schemas.serde import decode, encode
from schemas.topics import key_for
from stream_processors.errors import AnalyticsError
from stream_processors.grouping import GroupState, Policy, build
from stream_processors.join import CompleteRollout, RolloutJoin
from stream_processors.pipeline import group_step, rollout_step
from stream_processors.settings import ProcessorSettings
from stream_processors.sink import Sink, connect

log = logging.getLogger("tether.processors")


def internal_topics(settings: ProcessorSettings) -> list[topics.Topic]:
    """The app's own topics, created before the worker starts: a consumer that subscribes to a topic that does
    not exist yet is not assigned its partitions until a metadata refresh, minutes later."""
    app_id = settings.app_id
    return [
        topics.Topic(f"{app_id}-complete", "group_id", topics.SAMPLES.partitions, (), "complete rollouts by group",
                     max_bytes=topics.SAMPLES.max_bytes),
        topics.Topic(f"{app_id}-rollouts-changelog", "rollout_id", topics.CALLS.partitions, (),
                     "the join table's changelog", max_bytes=topics.SAMPLES.max_bytes, compacted=True),
        topics.Topic(f"{app_id}-groups-changelog", "group_id", topics.SAMPLES.partitions, (),
                     "the group table's changelog", max_bytes=topics.SAMPLES.max_bytes, compacted=True),
    ]


def create_app(settings: ProcessorSettings) -> faust.App:
    bus = settings.bus
    app = faust.App(
        settings.app_id,
        broker=[f"kafka://{server.strip()}" for server in bus.bootstrap_servers.split(",")],
        store="memory://",
        datadir=str(settings.data_dir),
        processing_guarantee="at_least_once",
        topic_partitions=topics.CALLS.partitions,
        topic_replication_factor=bus.replication_factor,
        consumer_auto_offset_reset="earliest",
        producer_acks=-1,
        producer_max_request_size=bus.max_request_bytes,
        consumer_max_fetch_size=bus.max_partition_fetch_bytes,
        stream_buffer_maxsize=256,
        web_enabled=False,
        key_serializer="raw",
        value_serializer="raw",  # our own encodings: Avro events, JSON table states
    )
    policy = Policy(settings.failed, settings.fill_reward)
    raw: dict[str, Any] = {"key_type": bytes, "value_type": bytes, "key_serializer": "raw", "value_serializer": "raw"}
    sources = app.topic(topics.CALLS.name, topics.ROLLOUTS.name, **raw)
    complete = app.topic(f"{settings.app_id}-complete", partitions=topics.SAMPLES.partitions, internal=True, **raw)
    samples = app.topic(topics.SAMPLES.name, **raw)
    deadletters = app.topic(topics.DEADLETTER.name, **raw)
    rollouts = app.Table("rollouts", key_type=bytes, value_type=bytes, partitions=topics.CALLS.partitions)
    groups = app.Table("groups", key_type=bytes, value_type=bytes, partitions=topics.SAMPLES.partitions)
    stats = {"dead_lettered": 0, "groups": 0, "sink_failures": 0}

    async def accept(event: faust.EventT[bytes], agent: str, report: bool = True) -> Event | None:
        """The decoded event, or None after sending the record to the dead letters with the reason
        (once: by the first agent that reads its topic)."""
        message = event.message
        try:
            decoded = decode(event.value)
        except DecodeError as exc:
            reason, error_type = str(exc), type(exc).__name__
        else:
            if type(decoded) in topics.BY_NAME[message.topic].events:
                return decoded
            reason, error_type = f"{type(decoded).__name__} does not belong on {message.topic}", "WrongTopic"
        if not report:
            return None
        dead = DeadLetter(topic=message.topic, partition=message.partition, offset=message.offset,
                          reason=reason[:2000], error_type=error_type, consumer=f"{settings.app_id}.{agent}",
                          key=event.key, value=event.value)
        await (await deadletters.send(key=key_for(dead), value=encode(dead)))
        stats["dead_lettered"] += 1
        log.warning("dead-lettered %s[%d]@%d: %s", message.topic, message.partition, message.offset, reason)
        return None

    async def emit(group_bytes: bytes, gid: bytes) -> None:
        await (await samples.send(key=gid, value=group_bytes))
        stats["groups"] += 1

    @app.agent(sources)
    async def join(stream: faust.StreamT[bytes]) -> None:
        async for event in stream.events():
            decoded = await accept(event, "join")
            if decoded is None or (settings.run_id and getattr(decoded, "run_id", None) != settings.run_id):
                continue
            rid = decoded.rollout_id.encode()  # type: ignore[union-attr]  # both topics carry rollout events
            state = rollouts.get(rid)
            joined = RolloutJoin.loads(state) if state is not None else RolloutJoin(rid.decode())
            result = rollout_step(joined, decoded)
            rollouts[rid] = joined.dumps()
            if result is not None:
                await (await complete.send(key=result.group_id.encode(), value=result.dumps()))

    @app.agent(complete)
    async def group(stream: faust.StreamT[bytes]) -> None:
        async for gid, value in stream.items():
            rollout = CompleteRollout.loads(value)
            state = groups.get(gid)
            current = GroupState.loads(state) if state is not None else GroupState(gid.decode(), time.time())
            ready = group_step(current, rollout, policy)
            if ready is not None:
                await emit(encode(ready), gid)
                current.rollouts.clear()  # only the marker stays
            groups[gid] = current.dumps()

    async def partial_groups() -> None:
        now = time.time()
        for gid, state in list(groups.items()):
            current = GroupState.loads(state)
            if current.emitted or now - current.first_seen < settings.group_timeout_s or not current.rollouts:
                continue
            await emit(encode(build(current.members(), policy, partial=True)), gid)
            current.emitted, current.rollouts = True, {}
            groups[gid] = current.dumps()
            log.warning("task group %s timed out: published partial", gid.decode())

    app.timer(settings.check_interval_s)(partial_groups)

    if settings.clickhouse_dsn:
        dsn = settings.clickhouse_dsn
        joined_topics = {topics.CALLS.name, topics.ROLLOUTS.name}  # the join agent reports their bad records
        analytics = app.topic(topics.CALLS.name, topics.ROLLOUTS.name, topics.SAMPLES.name, topics.CONTROL.name,
                              **raw)

        @app.agent(analytics)
        async def sink(stream: faust.StreamT[bytes]) -> None:
            """Analytics must never stop the training data: a ClickHouse failure is logged and the sink goes on
            (the tables can be rebuilt from the topics)."""
            writer: Sink | None = None
            batches = stream.take_events(settings.sink_batch, within=settings.sink_flush_s)  # type: ignore[attr-defined]
            async for batch in batches:
                try:
                    writer = writer or Sink(await asyncio.to_thread(connect, dsn))
                except AnalyticsError as exc:
                    log.error("analytics sink: %s", exc)
                    continue
                for event in batch:
                    decoded = await accept(event, "sink", report=event.message.topic not in joined_topics)
                    if decoded is not None and (not settings.run_id
                                                or getattr(decoded, "run_id", None) == settings.run_id):
                        writer.add(decoded)
                try:
                    await asyncio.to_thread(writer.flush)
                except AnalyticsError as exc:
                    stats["sink_failures"] += 1
                    log.error("analytics sink: %s; %d rows not written", exc, sum(map(len, writer.pending.values())))
                    writer.pending.clear()

    app.tether_stats = stats  # type: ignore[attr-defined]  # for logs and tests
    return app
