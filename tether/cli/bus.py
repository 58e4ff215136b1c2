"""`tether topics | events | rollouts | replay`: what the bus holds, read and rebuilt."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from tether.cli.support import console, fail, failing_cleanly, load_settings

if TYPE_CHECKING:
    from controller.plan import RunState
    from schemas.settings import BusSettings
    from schemas.topics import Topic

topics_app = typer.Typer(help="The topic catalogue on the bus.", no_args_is_help=True)
events_app = typer.Typer(help="Events on the bus, decoded.", no_args_is_help=True)
rollouts_app = typer.Typer(help="Rollouts of a run, as tether.rollouts records them.", no_args_is_help=True)


@topics_app.command("create")
def topics_create() -> None:
    """Create the catalogue's topics that are missing (idempotent)."""
    from schemas.admin import ensure_topics
    from schemas.settings import BusSettings

    settings = load_settings(BusSettings)
    with failing_cleanly():
        created = asyncio.run(ensure_topics(settings))
    typer.echo(f"Created {', '.join(created)}." if created else "All topics exist.", err=True)


@topics_app.command("list")
def topics_list() -> None:
    """The catalogue: topic, key, partitions, events."""
    from schemas.topics import CATALOGUE

    table = Table()
    table.add_column("topic", no_wrap=True)
    table.add_column("key", no_wrap=True)
    table.add_column("partitions", justify="right")
    table.add_column("events")
    table.add_column("what")
    for topic in CATALOGUE:
        table.add_row(topic.name, topic.key_field, str(topic.partitions),
                      ", ".join(cls.__name__ for cls in topic.events), topic.doc)
    Console().print(table)


@events_app.command("tail")
def events_tail(
    topic: Annotated[str, typer.Argument(help="A catalogue topic, e.g. tether.calls.")],
    limit: Annotated[int, typer.Option("--max", help="Stop after this many events (0: never).")] = 0,
    idle_s: Annotated[float, typer.Option(help="Stop after this many seconds without events (0: never).")] = 0,
) -> None:
    """Print a topic's events from the beginning as JSON lines (undecodable records go to the dead letters)."""
    from schemas.settings import BusSettings
    from schemas.topics import BY_NAME

    if topic not in BY_NAME:
        fail(f"TOPIC must be one of {', '.join(BY_NAME)}; got {topic!r}", 2)
    settings = load_settings(BusSettings)
    with failing_cleanly():
        asyncio.run(_tail(settings, BY_NAME[topic], limit, idle_s))


async def _tail(settings: BusSettings, topic: Topic, limit: int, idle_s: float) -> None:
    import time

    from schemas.consumer import EventConsumer
    from schemas.producer import EventProducer
    from schemas.serde import to_jsonable

    seen, last = 0, time.monotonic()
    async with EventProducer(settings) as deadletters, EventConsumer(settings, [topic], deadletters) as consumer:
        async for batch in consumer.batches(timeout_ms=500):
            for received in batch:
                print(json.dumps({"type": type(received.event).__name__, "partition": received.partition,
                                  "offset": received.offset, **to_jsonable(received.event)}), flush=True)
                seen += 1
                if limit and seen >= limit:
                    return
            last = time.monotonic() if batch else last
            if idle_s and time.monotonic() - last > idle_s:
                return


@rollouts_app.command("ls")
def rollouts_ls(run: Annotated[str, typer.Option("--run", help="The run id.")]) -> None:
    """Every rollout of a run: task, attempt, status, reward, duration."""
    from controller.recorded import read_run
    from schemas.settings import BusSettings

    settings = load_settings(BusSettings)
    with failing_cleanly():
        state = asyncio.run(read_run(settings, run))
    Console().print(rollouts_table(state, run))


def rollouts_table(state: RunState, run: str) -> Table:
    """Ids are kept whole however narrow the terminal (people copy them); the reason wraps instead."""
    table = Table(title=f"rollouts of run {run}")
    longest = {c: max((len(x) for x in xs), default=0) for c, xs in (
        ("rollout", state.rollouts), ("task", [s.started.task_id for s in state.rollouts.values()]))}
    for column in ("rollout", "task"):
        table.add_column(column, no_wrap=True, min_width=longest[column])
    for column in ("attempt", "status", "exit", "reward", "seconds"):
        table.add_column(column, no_wrap=True)
    table.add_column("reason", overflow="fold")
    for rid, rollout in sorted(state.rollouts.items()):
        f = rollout.finished
        table.add_row(rid, rollout.started.task_id, str(rollout.started.attempt), f.status if f else "running",
                      "" if f is None or f.exit_code is None else str(f.exit_code),
                      "" if f is None or f.reward is None else f"{f.reward:g}",
                      "" if f is None else f"{f.duration_s:.1f}", (f.reason or "") if f else "")
    return table


def replay(
    run: Annotated[str, typer.Option("--run", help="The run id.")],
    out: Annotated[Path | None, typer.Option(help="Write the task groups here, one JSON object per line.")] = None,
    compare: Annotated[bool, typer.Option(help="Also hash what tether.samples holds for the run.")] = True,
) -> None:
    """Rebuild a run's task groups from tether.calls and tether.rollouts, with a content hash."""
    from rich.progress import Progress

    from schemas.samples import unique_groups
    from stream_processors.grouping import Policy
    from stream_processors.pipeline import content_hash, training_hash, verdict
    from stream_processors.replay import replay, write_jsonl
    from stream_processors.settings import ProcessorSettings

    settings = load_settings(ProcessorSettings)
    with failing_cleanly(), Progress(console=console) as progress:
        events, groups = asyncio.run(replay(settings.bus, run, Policy(settings.failed, settings.fill_reward),
                                            progress))
        stored = asyncio.run(unique_groups(settings.bus, run)) if compare else None
    rebuilt = content_hash(groups)
    partial = sum(g.partial for g in groups)
    typer.echo(f"replayed {len(events)} events of run {run}: {len(groups)} task groups ({partial} partial)")
    typer.echo(f"rebuilt   sha256 {rebuilt}")
    typer.echo(f"training  sha256 {training_hash(groups, run)} (names within the run, no times: compares runs)")
    if out is not None:
        write_jsonl(groups, out)
        typer.echo(f"wrote {out}")
    if stored is not None:
        typer.echo(f"samples   sha256 {content_hash(stored)} ({len(stored)} task groups on tether.samples)")
        typer.echo(verdict(groups, stored))
