"""A producer keeps every acknowledged event, exactly once, across a broker crash mid-stream."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from infra.kafka.launcher import KafkaBroker
from schemas import topics
from schemas.admin import ensure_topics
from schemas.consumer import EventConsumer
from schemas.errors import DeliveryError
from schemas.events import ModelCall
from schemas.producer import EventProducer
from schemas.settings import BusSettings
from tests.conftest import broker_settings
from tests.factories import example

N_EVENTS = 600
KILL_AFTER = 200  # acknowledged events before the broker is killed
IN_FLIGHT = 16


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[KafkaBroker]:
    """This test kills its broker, so it gets one of its own."""
    kafka = KafkaBroker(broker_settings(tmp_path / "kafka"))
    try:
        kafka.start()
        yield kafka
    finally:
        kafka.stop(force=True)


async def test_acknowledged_events_survive_a_broker_crash_exactly_once(own_broker: KafkaBroker) -> None:
    bus = BusSettings(bootstrap_servers=own_broker.bootstrap, delivery_timeout_s=90)
    await ensure_topics(bus, [topics.CALLS, topics.DEADLETTER])
    template = example(ModelCall, run_id="restart")
    acked: list[str] = []
    failed: list[str] = []
    crashed, enough_acked = asyncio.Event(), asyncio.Event()
    at_kill: list[int] = []
    in_flight: list[int] = []
    pending = [0]
    slots = asyncio.Semaphore(IN_FLIGHT)

    async with EventProducer(bus) as producer:

        async def send(i: int) -> None:
            call = replace(template, call_id=f"call-{i}", rollout_id=f"rollout-{i % 37}", seq=i)
            pending[0] += 1
            try:
                await producer.publish(call)
                acked.append(call.call_id)
                if len(acked) >= KILL_AFTER:
                    enough_acked.set()
            except DeliveryError:
                failed.append(call.call_id)
            finally:
                pending[0] -= 1
                slots.release()

        async def crash_and_restart() -> None:
            await enough_acked.wait()
            in_flight.append(pending[0])  # publishes awaiting their acknowledgement
            own_broker.stop(force=True)  # SIGKILL by PID: no clean shutdown
            at_kill.append(len(acked))
            crashed.set()
            await asyncio.sleep(1.0)
            await asyncio.to_thread(own_broker.start)

        restarter = asyncio.create_task(crash_and_restart())
        sends = []
        for i in range(N_EVENTS):
            await slots.acquire()
            sends.append(asyncio.create_task(send(i)))
            if i == N_EVENTS // 2:
                await crashed.wait()  # keep streaming through the outage
        await asyncio.gather(*sends)
        await restarter

    assert crashed.is_set()
    # The outage only delays acknowledgements: every send, including those in flight at the kill, succeeds.
    assert not failed
    assert len(acked) == N_EVENTS
    assert at_kill[0] < N_EVENTS // 2 + 1
    assert in_flight[0] > 0, "the kill should catch publishes in flight"

    stored: Counter[str] = Counter()
    async with EventProducer(bus) as deadletters, EventConsumer(bus, [topics.CALLS], deadletters) as consumer:
        ends = await consumer.end_offsets()  # read everything on the topic, not until a quiet moment
        async with asyncio.timeout(60):
            async for batch in consumer.batches(timeout_ms=500):
                stored.update(r.event.call_id for r in batch if isinstance(r.event, ModelCall))
                if all([await consumer.position(tp) >= end for tp, end in ends.items()]):
                    break

    missing = set(acked) - set(stored)
    duplicated = {cid: n for cid, n in stored.items() if n > 1}
    assert not missing, f"{len(missing)} acknowledged events lost"
    assert not duplicated, f"duplicates after the restart: {duplicated}"
