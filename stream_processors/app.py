"""The Faust application: the processors' agents (`agents.Processors`) on one app, and the app's own topics.

Tables live in memory and are restored from their changelog topics on start.
Delivery is at least once; exactly-once *results* come from determinism:
a task group's id is its task's, its content depends only on its rollouts,
the groups table marks it emitted, and readers of tether.samples keep the
first record per group id (`schemas.samples.unique_groups`). A processor killed
between publishing a group and recording that can publish it again,
byte for byte the same, and readers drop the copy.
"""

from __future__ import annotations

import faust

from schemas import topics
from stream_processors.agents import Processors
from stream_processors.settings import ProcessorSettings


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
    processors = Processors(app, settings)
    app.agent(processors.sources, name="join")(processors.join)
    app.agent(processors.complete, name="group")(processors.group)
    app.timer(settings.check_interval_s)(processors.tick)
    if settings.clickhouse_dsn:
        app.agent(processors.analytics, name="sink")(processors.sink)
    return app
