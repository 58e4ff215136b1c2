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
from schemas.security import ssl_context
from schemas.settings import BusSettings
from stream_processors.agents import Processors
from stream_processors.recovery import Tables
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
        # Faust's own leader-election topic, made here so that it is replicated like the others.
        topics.Topic(f"{app_id}-__assignor-__leader", "", 1, (), "Faust's leader election",
                     max_bytes=topics.CONTROL.max_bytes),
    ]


def broker_credentials(bus: BusSettings) -> faust.auth.Credentials | None:
    """Faust's form of the bus's security settings, from the same SSL context and user every other client
    gets (schemas.security)."""
    context = ssl_context(bus)
    if (login := bus.sasl_login) is not None:
        return faust.SASLCredentials(username=login[0], password=login[1], ssl_context=context,
                                     mechanism=bus.sasl_mechanism)
    return faust.SSLCredentials(context) if context is not None else None


def create_app(settings: ProcessorSettings) -> faust.App:
    bus = settings.bus
    app = faust.App(
        settings.app_id,
        broker=[f"kafka://{server.strip()}" for server in bus.bootstrap_servers.split(",")],
        broker_credentials=broker_credentials(bus),
        store="memory://",
        datadir=str(settings.data_dir),
        processing_guarantee="at_least_once",
        topic_partitions=topics.CALLS.partitions,
        # Every topic Faust would create is created first (internal_topics), with the replication the cluster
        # allows, and Faust leaves existing topics as they are: this only matters for one it would make itself.
        topic_replication_factor=bus.replication_factor or 1,
        consumer_auto_offset_reset="earliest",
        producer_acks=-1,
        producer_max_request_size=bus.max_request_bytes,
        consumer_max_fetch_size=bus.max_partition_fetch_bytes,
        # Records fetched ahead of the agents. The join waits for Kafka's acknowledgements once a batch; a buffer no
        # larger than the batch stopped the fetcher meanwhile (bench/episode_scaling.py).
        stream_buffer_maxsize=settings.stream_buffer,
        table_standby_replicas=settings.standby_replicas,
        # A worker that died holds its partitions until its session times out: Faust's default, 60 s, starved the
        # trainer of the groups of those partitions for a minute in bench/chaos.py. Heartbeats (every 3 s) keep a
        # live worker in.
        broker_session_timeout=15.0,
        web_enabled=False,
        TableManager=Tables,  # recovery that does not lose records waiting at a restart (stream_processors.recovery)
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
