"""Reading task groups from tether.samples: one per group id.

The stream processors deliver at least once and build each group
deterministically, so a group can appear twice only as the same bytes; the
first record per group id is the group. Trainer, replay and analytics all
read through this.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from schemas import topics
from schemas.consumer import EventConsumer
from schemas.events import TaskGroup
from schemas.producer import EventProducer
from schemas.settings import BusSettings


async def read_groups(bus: BusSettings, run_id: str) -> AsyncIterator[tuple[TaskGroup, bool]]:
    """Every TaskGroup of the run on tether.samples now, in log order, with whether it repeats an earlier one."""
    seen: set[str] = set()
    async with EventProducer(bus) as deadletters, \
            EventConsumer(bus, [topics.SAMPLES], deadletters, name=f"samples-{run_id}") as consumer:
        async for received in consumer.read_to_end():
            group = received.event
            if isinstance(group, TaskGroup) and group.run_id == run_id:
                yield group, group.group_id in seen
                seen.add(group.group_id)


async def unique_groups(bus: BusSettings, run_id: str) -> list[TaskGroup]:
    return [group async for group, repeated in read_groups(bus, run_id) if not repeated]
