"""`tether`: one command fronting every service; each group imports its service lazily."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(
    help="Tether: train the agent harness you ship with RL, through a gateway that records every call on Kafka.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
kafka_app = typer.Typer(help="The local Apache Kafka broker (single node, KRaft).", no_args_is_help=True)
topics_app = typer.Typer(help="The topic catalogue on the bus.", no_args_is_help=True)
events_app = typer.Typer(help="Events on the bus, decoded.", no_args_is_help=True)
engine_app = typer.Typer(help="The embedded inference engine (vLLM-compatible completions).", no_args_is_help=True)
model_app = typer.Typer(help="Models: build the tiny one the tests and the demo use.", no_args_is_help=True)
app.add_typer(kafka_app, name="kafka", rich_help_panel="Services")
app.add_typer(engine_app, name="engine", rich_help_panel="Services")
app.add_typer(model_app, name="model", rich_help_panel="Models")
app.add_typer(topics_app, name="topics", rich_help_panel="Bus")
app.add_typer(events_app, name="events", rich_help_panel="Bus")

console = Console(stderr=True)


@contextmanager
def failing_cleanly() -> Iterator[None]:
    """Our own errors become one line on stderr and exit code 1, never a traceback."""
    from infra.errors import InfraError
    from schemas.errors import BusError

    try:
        yield
    except (InfraError, BusError) as exc:
        console.print(f"[red]tether:[/red] {exc}", markup=True, highlight=False)
        raise typer.Exit(1) from exc


def _broker() -> Any:
    from infra.kafka.launcher import KafkaBroker
    from infra.kafka.settings import BrokerSettings

    return KafkaBroker(BrokerSettings())


@kafka_app.command("up")
def kafka_up() -> None:
    """Fetch (first time), format (first time) and start the broker; wait until it answers."""
    broker = _broker()
    with failing_cleanly(), console.status(f"Starting Kafka {broker.settings.version} on {broker.bootstrap}..."):
        pid = broker.start()
    console.print(f"Kafka {broker.settings.version} ready on {broker.bootstrap} (pid {pid})")


@kafka_app.command("down")
def kafka_down(force: Annotated[bool, typer.Option(help="SIGKILL instead of a clean shutdown.")] = False) -> None:
    """Stop the broker by its PID."""
    broker = _broker()
    with failing_cleanly():
        stopped = broker.stop(force=force)
    console.print("Kafka stopped." if stopped else "Kafka was not running.")


@kafka_app.command("status")
def kafka_status() -> None:
    """Running, ready (answers metadata requests), where, and which data."""
    status = _broker().status()
    table = Table(show_header=False, box=None)
    for field in dataclasses.fields(status):
        table.add_row(field.name, str(getattr(status, field.name)))
    Console().print(table)
    raise typer.Exit(0 if status.ready else 3)


@kafka_app.command("fetch")
def kafka_fetch() -> None:
    """Download the broker's jars with Maven into the cache (outside git)."""
    broker = _broker()
    with failing_cleanly(), console.status("Fetching Kafka with Maven..."):
        libs = broker.fetch()
    console.print(f"Kafka {broker.settings.version} jars in {libs}")


@kafka_app.command("wipe")
def kafka_wipe() -> None:
    """Delete the broker's data (topics and offsets); it must be stopped."""
    broker = _broker()
    with failing_cleanly():
        broker.wipe()
    console.print(f"Wiped {broker.data_dir}")


@topics_app.command("create")
def topics_create() -> None:
    """Create the catalogue's topics that are missing (idempotent)."""
    from schemas.admin import ensure_topics
    from schemas.settings import BusSettings

    with failing_cleanly():
        created = asyncio.run(ensure_topics(BusSettings()))
    console.print(f"Created {', '.join(created)}." if created else "All topics exist.")


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
    from schemas.topics import BY_NAME

    if topic not in BY_NAME:
        console.print(f"[red]tether:[/red] TOPIC must be one of {', '.join(BY_NAME)}; got {topic!r}")
        raise typer.Exit(2)
    with failing_cleanly():
        asyncio.run(_tail(BY_NAME[topic], limit, idle_s))


async def _tail(topic: Any, limit: int, idle_s: float) -> None:
    import time

    from schemas.consumer import EventConsumer
    from schemas.producer import EventProducer
    from schemas.serde import to_jsonable
    from schemas.settings import BusSettings

    settings = BusSettings()
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


@model_app.command("init-tiny")
def model_init_tiny(
    out: Annotated[Path, typer.Option(help="Directory to write the model to (Hugging Face format).")],
    seed: Annotated[int, typer.Option(help="Same seed, byte-identical files.")] = 0,
) -> None:
    """A tiny random Qwen2 model and a byte-level BPE tokenizer trained on a generated corpus."""
    from trainer.tiny_model import init_tiny

    with console.status(f"Building the tiny model (seed {seed})..."):
        init_tiny(out, seed)
    console.print(f"Tiny model written to {out}")


@engine_app.command("serve")
def engine_serve(
    model: Annotated[str | None, typer.Option(help="Model directory or Hugging Face name.")] = None,
    host: Annotated[str | None, typer.Option()] = None,
    port: Annotated[int | None, typer.Option()] = None,
    device: Annotated[str | None, typer.Option(help="auto, cpu, cuda, cuda:N.")] = None,
) -> None:
    """Serve a model on /v1/completions until interrupted."""
    from pydantic import ValidationError

    from trainer.engine.serve import serve
    from trainer.engine.settings import EngineSettings

    given = {"model": model, "host": host, "port": port, "device": device}
    overrides: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
    try:
        settings = EngineSettings(**overrides)
    except ValidationError as exc:
        first = exc.errors()[0]
        console.print(f"[red]tether:[/red] {'.'.join(map(str, first['loc']))}: {first['msg']}")
        raise typer.Exit(2) from exc
    try:
        serve(settings)
    except OSError as exc:
        console.print(f"[red]tether:[/red] cannot load model {settings.model!r}: {exc}".splitlines()[0])
        raise typer.Exit(1) from exc


if __name__ == "__main__":
    app()
