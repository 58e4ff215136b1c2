"""A run's rollouts as tether.rollouts holds them now: read from the beginning up to the current end."""

from __future__ import annotations

from controller.plan import RunState
from schemas import topics
from schemas.consumer import EventConsumer
from schemas.producer import EventProducer
from schemas.settings import BusSettings


async def read_run(bus: BusSettings, run_id: str, group_size: int = 1, max_attempts: int = 1) -> RunState:
    state = RunState(run_id, group_size, max_attempts)
    async with EventProducer(bus) as deadletters, \
            EventConsumer(bus, [topics.ROLLOUTS], deadletters, name=f"rollouts-ls-{run_id}") as consumer:
        async for received in consumer.read_to_end():
            state.apply(received.event)
    return state
