"""Bytes no reader accepts go to tether.deadletter with the reason, and the consumer goes on."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition

from schemas import topics
from schemas.consumer import EventConsumer, Received
from schemas.errors import DeliveryError
from schemas.events import DeadLetter, Event, ModelCall, UpdateRequested
from schemas.producer import Delivery, EventProducer
from schemas.serde import MAGIC, encode
from schemas.settings import BusSettings
from tests.factories import example


async def test_garbage_is_dead_lettered_and_the_stream_goes_on(
    bus: BusSettings, producer: EventProducer, run_id: str
) -> None:
    call = example(ModelCall, run_id=run_id, rollout_id=f"{run_id}-r")
    key = call.rollout_id.encode()  # same key: same partition, so the bad records come first
    bad = {
        b"\x00\x01 not avro at all " + run_id.encode(): "NotSingleObject",
        MAGIC + b"\xee" * 8 + run_id.encode(): "UnknownSchema",
        encode(call)[:-4] + run_id.encode()[:1]: "CorruptRecord",
    }
    raw = AIOKafkaProducer(bootstrap_servers=bus.bootstrap_servers)
    await raw.start()
    try:
        for value in bad:
            await raw.send_and_wait(topics.CALLS.name, value, key=key)
    finally:
        await raw.stop()
    await producer.publish(call)

    got: list[Received] = []
    async with EventConsumer(bus, [topics.CALLS], producer, name="dl-test") as consumer:
        async with asyncio.timeout(60):
            async for received in consumer:
                if isinstance(received.event, ModelCall) and received.event.run_id == run_id:
                    got.append(received)
                    break
        assert consumer.dead_lettered >= len(bad)
    assert [r.event for r in got] == [call]

    letters: dict[bytes, DeadLetter] = {}
    async with EventConsumer(bus, [topics.DEADLETTER], producer) as consumer:
        async with asyncio.timeout(60):
            async for received in consumer:
                letter = received.event
                assert isinstance(letter, DeadLetter)
                if letter.value in bad:
                    letters[letter.value] = letter
                    if len(letters) == len(bad):
                        break
    for value, error_type in bad.items():
        letter = letters[value]
        assert letter.error_type == error_type
        assert letter.topic == topics.CALLS.name
        assert letter.key == key
        assert letter.consumer == "dl-test"
        assert letter.reason


class FailingSink:
    """A dead-letter topic that cannot take anything (Kafka down, say)."""

    async def publish(self, event: Event) -> Delivery:
        raise DeliveryError("dead-letter topic unavailable")


async def test_a_failed_dead_letter_rewinds_instead_of_skipping(bus: BusSettings, producer: EventProducer,
                                                                  run_id: str) -> None:
    calls = [replace(example(ModelCall, run_id=run_id), call_id=f"{run_id}-{i}", seq=i) for i in range(3)]
    raw = AIOKafkaProducer(bootstrap_servers=bus.bootstrap_servers)
    await raw.start()
    try:
        partition = topics.partition_for(calls[0].rollout_id.encode(), topics.CALLS.partitions)
        first = await raw.send_and_wait(topics.CALLS.name, b"garbage " + run_id.encode(),
                                        key=calls[0].rollout_id.encode(), partition=partition)
    finally:
        await raw.stop()
    await producer.publish_many(calls)
    tp = TopicPartition(topics.CALLS.name, partition)

    group = f"rewind-{run_id}"
    async with EventConsumer(bus, [topics.CALLS], FailingSink(), group_id=group) as consumer:
        with pytest.raises(DeliveryError):
            async for _ in consumer:
                pass
        assert await consumer.position(tp) <= first.offset  # rewound to the rejected record, not past it

    # Once the dead-letter topic is back, the same group reads the garbage and then every call.
    async with EventConsumer(bus, [topics.CALLS], producer, group_id=group) as consumer:
        seen: list[str] = []
        async with asyncio.timeout(60):
            async for received in consumer:
                if isinstance(received.event, ModelCall) and received.event.run_id == run_id:
                    seen.append(received.event.call_id)
                    if len(seen) == 3:
                        break
        assert seen == [c.call_id for c in calls]
        assert consumer.dead_lettered >= 1


async def test_an_event_on_the_wrong_topic_is_dead_lettered(bus: BusSettings, producer: EventProducer,
                                                             run_id: str) -> None:
    call = example(ModelCall, run_id=run_id)
    await producer.send_many([(topics.CONTROL.name, run_id.encode(), encode(call))])
    await producer.publish(UpdateRequested(run_id=run_id, version=1, n_task_groups=1))
    async with EventConsumer(bus, [topics.CONTROL], producer) as consumer:
        async with asyncio.timeout(60):
            async for received in consumer:
                if isinstance(received.event, UpdateRequested) and received.event.run_id == run_id:
                    break
                assert not isinstance(received.event, ModelCall)
        assert consumer.dead_lettered >= 1
    letters = await read_letters(bus, producer, lambda d: d.key == run_id.encode())
    assert letters[0].error_type == "WrongTopic" and "ModelCall" in letters[0].reason


async def test_a_record_at_the_size_limit_is_dead_lettered_whole(bus: BusSettings, producer: EventProducer,
                                                                 run_id: str) -> None:
    big = b"\x00" + run_id.encode() + b"x" * (topics.CALLS.max_bytes - 4096)
    await producer.send_many([(topics.CALLS.name, run_id.encode(), big)])
    async with EventConsumer(bus, [topics.CALLS], producer) as consumer:
        async with asyncio.timeout(120):
            assert not [r async for r in consumer.read_to_end(timeout_ms=500) if r.key == run_id.encode()]
    letters = await read_letters(bus, producer, lambda d: d.key == run_id.encode())
    assert letters[0].value == big and letters[0].error_type == "NotSingleObject"


async def read_letters(bus: BusSettings, producer: EventProducer, wanted: Callable[[DeadLetter], bool]
                       ) -> list[DeadLetter]:
    async with EventConsumer(bus, [topics.DEADLETTER], producer) as consumer:
        async with asyncio.timeout(60):
            async for received in consumer:
                assert isinstance(received.event, DeadLetter)
                if wanted(received.event):
                    return [received.event]
    raise AssertionError("unreachable")
