"""A producer keeps every acknowledged event, exactly once, across a broker crash mid-stream."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import replace

from infra.kafka.launcher import KafkaBroker
from schemas import topics
from schemas.admin import ensure_topics
from schemas.consumer import EventConsumer
from schemas.errors import DeliveryError
from schemas.events import ModelCall
from schemas.producer import EventProducer
from schemas.settings import BusSettings
from tests.factories import example

BEFORE, BURST, AFTER = 200, 64, 300  # events acknowledged before the crash, sent at it, sent through the outage
IN_FLIGHT = 16


async def test_acknowledged_events_survive_a_broker_crash_exactly_once(own_broker: KafkaBroker) -> None:
    bus = BusSettings(bootstrap_servers=own_broker.bootstrap, delivery_timeout_s=90)
    await ensure_topics(bus, [topics.CALLS, topics.DEADLETTER])
    template = example(ModelCall, run_id="restart")
    acked: list[str] = []
    failed: list[str] = []

    async with EventProducer(bus) as producer:

        async def send(i: int) -> None:
            call = replace(template, call_id=f"call-{i}", rollout_id=f"rollout-{i % 37}", seq=i)
            try:
                await producer.publish(call)
                acked.append(call.call_id)
            except DeliveryError:
                failed.append(call.call_id)

        async def stream(first: int, n: int) -> None:
            slots = asyncio.Semaphore(IN_FLIGHT)

            async def one(i: int) -> None:
                async with slots:
                    await send(i)

            await asyncio.gather(*[one(i) for i in range(first, first + n)])

        await stream(0, BEFORE)
        burst = [asyncio.create_task(send(i)) for i in range(BEFORE, BEFORE + BURST)]
        await asyncio.sleep(0)  # into the producer: sent or queued, not yet acknowledged
        unacknowledged_at_kill = sum(not t.done() for t in burst)
        own_broker.stop(force=True)  # SIGKILL by PID: no clean shutdown
        def restart() -> None:
            time.sleep(1.0)
            own_broker.start()

        restarted = asyncio.create_task(asyncio.to_thread(restart))
        await stream(BEFORE + BURST, AFTER)  # the stream goes on through the outage
        await asyncio.gather(*burst)
        await restarted

    # The outage only delays acknowledgements: every send, the burst at the kill included, succeeds.
    assert unacknowledged_at_kill > 0
    assert not failed
    assert len(acked) == BEFORE + BURST + AFTER

    stored: Counter[str] = Counter()
    async with EventProducer(bus) as deadletters, EventConsumer(bus, [topics.CALLS], deadletters) as consumer:
        async with asyncio.timeout(60):  # everything on the topic, not until a quiet moment
            async for r in consumer.read_to_end(timeout_ms=500):
                if isinstance(r.event, ModelCall):
                    stored[r.event.call_id] += 1

    missing = set(acked) - set(stored)
    duplicated = {cid: n for cid, n in stored.items() if n > 1}
    assert not missing, f"{len(missing)} acknowledged events lost"
    assert not duplicated, f"duplicates after the restart: {duplicated}"
