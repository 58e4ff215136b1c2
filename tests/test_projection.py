"""The one way to read the log: `read_to_end` and `follow` on a real broker, and the dead-letter decision."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import replace

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from hypothesis import given
from hypothesis import strategies as st

from schemas import topics
from schemas.admin import ensure_topics
from schemas.consumer import CAUGHT_UP, CaughtUp, EventConsumer, Received
from schemas.deadletters import MAX_REASON, Rejection, accept
from schemas.events import DeadLetter, Event, ModelCall, RolloutStarted, UpdateRequested, rollout_of, run_of
from schemas.producer import EventProducer
from schemas.serde import encode
from schemas.settings import BusSettings
from schemas.topics import BY_NAME, CATALOGUE, key_for, topic_for
from tests.factories import example, examples


async def scratch_topic(bus: BusSettings, partitions: int = 3) -> topics.Topic:
    """A topic of its own (outside the catalogue, so it takes any event): tests see exactly what they wrote."""
    topic = topics.Topic(f"test.projection.{uuid.uuid4().hex[:10]}", "rollout_id", partitions, (), "scratch",
                         max_bytes=topics.CALLS.max_bytes)
    await ensure_topics(bus, [topic])
    return topic


async def write(bus: BusSettings, topic: topics.Topic, values: list[bytes], keys: list[bytes]) -> None:
    async with EventProducer(bus) as producer:
        await producer.send_many([(topic.name, key, value) for key, value in zip(keys, values, strict=True)])


def started(run_id: str, i: int) -> RolloutStarted:
    return replace(example(RolloutStarted, run_id=run_id, rollout_id=f"r-{i}"), group_id=f"g-{i % 3}")


async def test_read_to_end_yields_what_the_topic_holds_then_stops(bus: BusSettings, run_id: str) -> None:
    topic = await scratch_topic(bus)
    written = [started(run_id, i) for i in range(40)]
    await write(bus, topic, [encode(e) for e in written], [e.rollout_id.encode() for e in written])
    seen: list[tuple[int, int]] = []
    async with EventProducer(bus) as deadletters, EventConsumer(bus, [topic], deadletters) as consumer:
        async with asyncio.timeout(60):
            got = [r async for r in consumer.read_to_end(progress=lambda done, total: seen.append((done, total)))]
    assert sorted((r.event for r in got), key=lambda e: int((rollout_of(e) or "")[2:])) == written
    for partition in {r.partition for r in got}:  # in log order within each partition
        offsets = [r.offset for r in got if r.partition == partition]
        assert offsets == sorted(offsets)
    assert seen[-1] == (40, 40)
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)


async def test_an_empty_topic_reads_as_nothing_and_follow_is_caught_up_at_once(bus: BusSettings) -> None:
    topic = await scratch_topic(bus)
    async with EventProducer(bus) as deadletters, EventConsumer(bus, [topic], deadletters) as consumer:
        async with asyncio.timeout(30):
            assert [r async for r in consumer.read_to_end()] == []
            assert await anext(consumer.follow()) is CAUGHT_UP


async def test_follow_marks_the_catch_up_once_then_keeps_reading(bus: BusSettings, run_id: str) -> None:
    topic = await scratch_topic(bus)
    before = [started(run_id, i) for i in range(12)]
    after = [started(run_id, i) for i in range(12, 20)]
    await write(bus, topic, [encode(e) for e in before], [e.rollout_id.encode() for e in before])
    items: list[Received | CaughtUp] = []
    async with EventProducer(bus) as deadletters, EventConsumer(bus, [topic], deadletters) as consumer:
        async with asyncio.timeout(60):
            async for item in consumer.follow(timeout_ms=100):
                items.append(item)
                if item is CAUGHT_UP:
                    await write(bus, topic, [encode(e) for e in after], [e.rollout_id.encode() for e in after])
                if sum(isinstance(i, Received) for i in items) == len(before) + len(after):
                    break
    marks = [n for n, item in enumerate(items) if isinstance(item, CaughtUp)]
    assert marks == [len(before)]
    events = [i.event for i in items if isinstance(i, Received)]
    assert {rollout_of(e) for e in events[:len(before)]} == {e.rollout_id for e in before}
    assert {rollout_of(e) for e in events[len(before):]} == {e.rollout_id for e in after}


async def test_rejected_records_count_towards_the_end_but_are_not_yielded(bus: BusSettings, run_id: str) -> None:
    topic = await scratch_topic(bus, partitions=1)
    good = [started(run_id, i) for i in range(3)]
    values = [b"garbage", encode(good[0]), encode(good[1]), b"\x00more garbage", encode(good[2]), b"tail garbage"]
    await write(bus, topic, values, [b"k"] * len(values))
    async with EventProducer(bus) as deadletters, \
            EventConsumer(bus, [topic], deadletters, name="projection-test") as consumer:
        async with asyncio.timeout(60):
            got = [r.event async for r in consumer.read_to_end()]
        assert consumer.dead_lettered == 3
    assert got == good


async def test_read_to_end_starts_from_a_sought_position(bus: BusSettings, run_id: str) -> None:
    topic = await scratch_topic(bus, partitions=1)
    written = [started(run_id, i) for i in range(10)]
    raw = AIOKafkaProducer(bootstrap_servers=bus.bootstrap_servers)
    await raw.start()
    try:
        for e in written:
            await raw.send_and_wait(topic.name, encode(e), key=b"k", partition=0)
    finally:
        await raw.stop()
    async with EventProducer(bus) as deadletters, EventConsumer(bus, [topic], deadletters) as consumer:
        (tp,) = consumer.assignment()
        consumer.seek(tp, 6)
        async with asyncio.timeout(60):
            got = [r.event async for r in consumer.read_to_end()]
    assert got == written[6:]


# -- the dead-letter decision, pure -----------------------------------------------------------------------


@pytest.mark.parametrize("event", examples(), ids=lambda e: type(e).__name__)
def test_an_event_is_accepted_on_its_own_topic_and_rejected_elsewhere(event: Event) -> None:
    home = topic_for(event)
    assert accept(encode(event), home.name) == event
    for other in CATALOGUE:
        if type(event) not in other.events:
            rejected = accept(encode(event), other.name)
            assert rejected == Rejection(f"{type(event).__name__} does not belong on {other.name}", "WrongTopic")


@given(st.binary(max_size=200))
def test_bytes_that_do_not_decode_are_rejected_with_the_decoder_s_reason(value: bytes) -> None:
    decided = accept(value, topics.CALLS.name)
    if isinstance(decided, Rejection):
        assert decided.reason and decided.error_type
    else:  # only a well-formed record of this topic may pass
        assert type(decided) in BY_NAME[topics.CALLS.name].events


def test_a_dead_letter_carries_the_record_whole_and_the_reason_cut() -> None:
    value = b"\x00" * 50_000
    letter = Rejection("x" * 10_000, "CorruptRecord").letter(topic="tether.calls", partition=3, offset=9, key=b"k",
                                                           value=value, consumer="c")
    assert isinstance(letter, DeadLetter)
    assert letter.value == value and letter.key == b"k" and (letter.partition, letter.offset) == (3, 9)
    assert letter.reason == "x" * MAX_REASON and letter.error_type == "CorruptRecord"


def test_every_event_names_its_run_and_rollout_events_their_rollout() -> None:
    for event in examples(run_id="run-a", rollout_id="r-a"):
        if isinstance(event, DeadLetter):
            continue
        assert run_of(event) == "run-a"
        carried_on = topic_for(event)
        if carried_on in (topics.CALLS, topics.ROLLOUTS):
            assert rollout_of(event) == "r-a" and key_for(event) == b"r-a"
        else:
            assert rollout_of(event) is None
    letter = example(DeadLetter)
    assert run_of(letter) is None and rollout_of(letter) is None
    assert run_of(example(UpdateRequested, run_id="run-b")) == "run-b"
    assert rollout_of(example(ModelCall, rollout_id="r-b")) == "r-b"


async def test_a_reader_of_one_key_assigns_its_partition_seeks_by_time_and_decodes_only_that_key(
        bus: BusSettings, run_id: str) -> None:
    topic = await scratch_topic(bus, partitions=1)
    mine = [started(run_id, i) for i in range(4)]
    values = [encode(mine[0]), b"someone else's garbage", encode(mine[1]), encode(started(run_id, 9)),
              encode(mine[2]), encode(mine[3])]
    keys = [b"mine", b"other", b"mine", b"other", b"mine", b"mine"]
    await write(bus, topic, values, keys)
    tp = TopicPartition(topic.name, 0)
    async with EventProducer(bus) as deadletters, EventConsumer(bus, [], deadletters) as consumer:
        consumer.assign([tp])
        async with asyncio.timeout(60):
            await consumer.seek_to_time(tp, 0)
            got = [r.event async for r in consumer.read_to_end(wanted=lambda r: r.key == b"mine")]
            assert got == mine and consumer.dead_lettered == 0  # the other key's garbage was never decoded
            await consumer.seek_to_time(tp, int((time.time() + 3600) * 1000))  # nothing that late: the end
            assert [r async for r in consumer.read_to_end()] == []


async def test_a_run_s_replay_passes_over_other_runs_records_by_their_header(bus: BusSettings, run_id: str) -> None:
    """Each published record names its run in a header; a replay decodes only its own run's (and records with
    no header, as older writers left them). A record of another run that would not even decode is passed over."""
    from stream_processors.replay import read_run_events

    ours, theirs = example(RolloutStarted, run_id=run_id), example(RolloutStarted, run_id=f"{run_id}-other")
    garbage = b"\x00 not avro " + run_id.encode()
    async with EventProducer(bus) as producer:
        await producer.publish_many([ours, theirs])
        await producer.send_many([(topics.ROLLOUTS.name, b"r-1", garbage)],
                                 [[(topics.RUN_HEADER, f"{run_id}-other".encode())]])
    raw = AIOKafkaConsumer(topics.ROLLOUTS.name, bootstrap_servers=bus.bootstrap_servers,
                           auto_offset_reset="earliest", enable_auto_commit=False)
    await raw.start()
    try:
        headers: dict[bytes, str | None] = {}
        async with asyncio.timeout(60):
            while len(headers) < 3:
                for records in (await raw.getmany(timeout_ms=500)).values():
                    headers.update({r.value: topics.run_in_header(r.headers) for r in records
                                    if r.value in (encode(ours), encode(theirs), garbage)})
    finally:
        await raw.stop()
    assert list(headers.values()) == [run_id, f"{run_id}-other", f"{run_id}-other"]
    assert await read_run_events(bus, run_id) == [ours]
    async with EventProducer(bus) as deadletters, \
            EventConsumer(bus, [topics.DEADLETTER], deadletters) as consumer:
        letters = [r.event async for r in consumer.read_to_end()]
    assert not any(isinstance(d, DeadLetter) and d.value == garbage for d in letters)  # never decoded, never judged
