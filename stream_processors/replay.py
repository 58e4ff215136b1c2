"""Rebuilding a run's training data from the topics: the same pure steps as the live processors."""

from __future__ import annotations

from pathlib import Path

from rich.progress import Progress

from schemas import topics
from schemas.consumer import EventConsumer, Record
from schemas.events import Event, TaskGroup, run_of
from schemas.heap import collector_paused
from schemas.producer import EventProducer
from schemas.settings import BusSettings
from schemas.topics import run_in_header
from stream_processors.grouping import Policy
from stream_processors.pipeline import canonical, rebuild


def ours(record: Record, run_id: str) -> bool:
    """Whether a record may be the run's: another run's, by its header, is passed over undecoded."""
    return run_in_header(record.headers) in (None, run_id)


async def read_run_events(bus: BusSettings, run_id: str, progress: Progress | None = None,
                          read: tuple[topics.Topic, ...] = (topics.CALLS, topics.ROLLOUTS)) -> list[Event]:
    """The run's events on the topics `read` (by default tether.calls and tether.rollouts), from the beginning to
    the current end."""
    found: list[Event] = []
    async with EventProducer(bus) as deadletters, \
            EventConsumer(bus, list(read), deadletters, name=f"replay-{run_id}") as consumer:
        shown = progress.add_task(f"reading {' and '.join(t.name for t in read)}") if progress else None

        def show(done: int, total: int) -> None:
            if progress is not None and shown is not None:
                progress.update(shown, completed=done, total=total)

        found.extend([r.event async for r in consumer.read_to_end(progress=show, wanted=lambda r: ours(r, run_id))
                      if run_of(r.event) == run_id])
    return found


def write_jsonl(groups: list[TaskGroup], path: Path) -> None:
    """One group per line, as canonical as `pipeline.canonical` (through Avro, sorted keys)."""
    with path.open("w") as out:
        for group in groups:
            out.write(canonical(group) + "\n")


async def replay(bus: BusSettings, run_id: str, policy: Policy,
                 progress: Progress | None = None) -> tuple[list[Event], list[TaskGroup]]:
    with collector_paused():  # the collector walking the events read so far was half of the read (schemas.heap)
        events = await read_run_events(bus, run_id, progress)
        return events, rebuild(events, run_id, policy)
