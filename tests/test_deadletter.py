"""Bytes no reader accepts go to tether.deadletter with the reason, and the consumer goes on."""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaProducer

from schemas import topics
from schemas.consumer import EventConsumer, Received
from schemas.events import DeadLetter, ModelCall
from schemas.producer import EventProducer
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
