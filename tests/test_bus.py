"""Every event through the real broker: right topic, stable partition, decoded back unchanged."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from aiokafka.errors import KafkaConnectionError
from aiokafka.partitioner import murmur2

from schemas import topics
from schemas.admin import ensure_topics
from schemas.consumer import EventConsumer, Received
from schemas.errors import ReadError, TopicSetupError
from schemas.events import DeadLetter, Event, ModelCall, RolloutSample, Segment, TaskGroup
from schemas.producer import EventProducer
from schemas.serde import encode
from schemas.settings import BusSettings
from tests.factories import example, examples


async def test_every_event_lands_on_its_topic_and_comes_back(
    bus: BusSettings, producer: EventProducer, run_id: str
) -> None:
    sent = examples(run_id=run_id, rollout_id=f"{run_id}-r")
    sent = [replace(e, topic=run_id) if isinstance(e, DeadLetter) else e for e in sent]  # mark ours
    deliveries = await producer.publish_many(sent)

    for event, delivery in zip(sent, deliveries, strict=True):
        topic = topics.topic_for(event)
        assert delivery.topic == topic.name
        key = topics.key_for(event)
        assert key is not None
        assert delivery.partition == topics.partition_for(key, topic.partitions)

    received = await _ours_only(bus, producer, run_id, len(sent))
    assert sorted(map(repr, (r.event for r in received))) == sorted(map(repr, sent))
    for r in received:
        assert r.topic == topics.topic_for(r.event).name
        assert r.key == topics.key_for(r.event)


async def _ours_only(bus: BusSettings, producer: EventProducer, run_id: str, n: int) -> list[Received]:
    """Read every topic from the start until this test's `n` events arrived."""
    mine: list[Received] = []
    async with EventConsumer(bus, topics.CATALOGUE, producer) as consumer:
        async with asyncio.timeout(60):
            async for batch in consumer.batches(timeout_ms=200):
                mine += [r for r in batch if _ours(r.event, run_id)]
                if len(mine) >= n:
                    return mine
    raise AssertionError("unreachable")


def _ours(event: Event, run_id: str) -> bool:
    return (event.topic if isinstance(event, DeadLetter) else event.run_id) == run_id


def test_placement_matches_the_java_client() -> None:
    # Vectors from Apache Kafka's own UtilsTest.testMurmur2 (signed 32-bit results).
    for key, java in [(b"21", -973932308), (b"foobar", -790332482), (b"a-little-bit-long-string", -985981536),
                      (b"a-little-bit-longer-string", -1486304829), (b"abc", 479470107)]:
        assert murmur2(key) & 0xFFFFFFFF == java & 0xFFFFFFFF
        assert topics.partition_for(key, 8) == (java & 0x7FFFFFFF) % 8


async def test_a_rollout_keeps_its_partition_across_producers(bus: BusSettings, run_id: str) -> None:
    call = example(ModelCall, run_id=run_id)
    seen = set()
    for i in range(3):
        async with EventProducer(bus, client_id=f"p{i}") as p:
            for seq in range(3):
                seen.add((await p.publish(replace(call, call_id=f"{run_id}-{i}-{seq}", seq=seq))).partition)
    assert len(seen) == 1


async def test_topic_creation_is_idempotent_and_checks_shape(bus: BusSettings) -> None:
    assert await ensure_topics(bus) == []
    wrong = replace(topics.CALLS, partitions=topics.CALLS.partitions + 1)
    with pytest.raises(TopicSetupError, match="partitions"):
        await ensure_topics(bus, [wrong])


async def test_publishing_to_a_broker_that_is_not_there_fails_loudly() -> None:
    from schemas.errors import DeliveryError

    nowhere = BusSettings(bootstrap_servers="127.0.0.1:1", request_timeout_ms=1000, delivery_timeout_s=2)
    with pytest.raises(DeliveryError, match=r"127\.0\.0\.1:1"):
        async with EventProducer(nowhere):
            pass


async def test_a_large_task_group_travels_whole(bus: BusSettings, producer: EventProducer, run_id: str) -> None:
    """Long rollouts make big samples: ~9 MiB in one record, more than a fetch of the consumer's size."""
    n = 1_000_000
    segment = Segment(token_ids=list(range(n)), loss_mask=[True] * n, logprobs=[-0.5] * n, weight_versions=[7] * n)
    group = TaskGroup(group_id=f"{run_id}-g", run_id=run_id, task_id="t", group_size=1,
                      rollouts=[RolloutSample(rollout_id=f"{run_id}-r", reward=1.0, status="succeeded",
                                              segments=[segment])])
    assert len(encode(group)) > max(bus.max_partition_fetch_bytes, topics.CALLS.max_bytes)
    await producer.publish(group)
    async with EventConsumer(bus, [topics.SAMPLES], producer) as consumer:
        async with asyncio.timeout(120):
            async for received in consumer:
                if isinstance(received.event, TaskGroup) and received.event.run_id == run_id:
                    assert received.event == group
                    return


@pytest.mark.parametrize("how", ["batches", "iteration"])
async def test_a_failed_fetch_is_the_bus_s_own_error_not_aiokafka_s(bus: BusSettings, how: str) -> None:
    """Readers catch BusError (the gateway answers 503 on it, the view retries); aiokafka's errors stop here."""
    async def gone(*_: object, **__: object) -> object:
        raise KafkaConnectionError("the broker went away")

    async with EventProducer(bus) as dlq, EventConsumer(bus, [topics.CALLS], dlq) as consumer:
        consumer._consumer.getmany = gone
        consumer._consumer.getone = gone
        with pytest.raises(ReadError, match="fetching from Kafka failed") as raised:
            if how == "batches":
                async for _ in consumer.batches(timeout_ms=100):
                    pass
            else:
                async for _ in consumer:
                    pass
        assert isinstance(raised.value.__cause__, KafkaConnectionError)
