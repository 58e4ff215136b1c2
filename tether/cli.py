"""`tether`: one command fronting every service; each group imports its service lazily."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from tether import cli_k8s, cli_kafka, cli_pipeline, cli_stack, cli_swe
from tether.cli_support import console, fail, failing_cleanly, load_settings

if TYPE_CHECKING:
    from schemas.settings import BusSettings
    from schemas.topics import Topic

SERVICES = """Services of a Tether run: kafka (the event log), engine (inference), gateway (the API harnesses call,
records every call), controller (runs harnesses), processors (calls to training samples, analytics), trainer
(learns, publishes weight versions)."""

app = typer.Typer(
    help="Tether: train the agent harness you ship with RL, through a gateway that records every call on Kafka.",
    epilog=SERVICES,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
topics_app = typer.Typer(help="The topic catalogue on the bus.", no_args_is_help=True)
events_app = typer.Typer(help="Events on the bus, decoded.", no_args_is_help=True)
engine_app = typer.Typer(help="The embedded inference engine (vLLM-compatible completions).", no_args_is_help=True)
gateway_app = typer.Typer(help="The gateway harnesses call (OpenAI and Anthropic APIs); records every call.",
                          no_args_is_help=True)
model_app = typer.Typer(help="Models: build the tiny one the tests and the demo use.", no_args_is_help=True)
app.add_typer(cli_kafka.kafka_app, name="kafka", rich_help_panel="Services")
app.add_typer(engine_app, name="engine", rich_help_panel="Services")
app.add_typer(gateway_app, name="gateway", rich_help_panel="Services")
app.add_typer(cli_pipeline.controller_app, name="controller", rich_help_panel="Services")
app.add_typer(cli_pipeline.rollouts_app, name="rollouts", rich_help_panel="Bus")
app.add_typer(cli_pipeline.processors_app, name="processors", rich_help_panel="Services")
app.add_typer(cli_pipeline.trainer_app, name="trainer", rich_help_panel="Services")
app.add_typer(model_app, name="model", rich_help_panel="Models")
app.add_typer(topics_app, name="topics", rich_help_panel="Bus")
app.add_typer(events_app, name="events", rich_help_panel="Bus")
app.add_typer(cli_k8s.k8s_app, name="k8s", rich_help_panel="Stack")
app.add_typer(cli_swe.swe_app, name="swe", rich_help_panel="Tasks")

app.command("replay", rich_help_panel="Bus")(cli_pipeline.replay_run)
app.command("analytics", rich_help_panel="Bus")(cli_pipeline.analytics)
app.command("view", rich_help_panel="Bus")(cli_pipeline.view)
app.command("up", rich_help_panel="Stack")(cli_stack.stack_up)
app.command("down", rich_help_panel="Stack")(cli_stack.stack_down)
app.command("status", rich_help_panel="Stack")(cli_stack.stack_status)
app.command("demo", rich_help_panel="Stack")(cli_stack.demo)


@app.callback()
def main() -> None:
    # Clients log every refused connection; the user gets our one-line error instead.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)


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


@model_app.command("init-tiny")
def model_init_tiny(
    out: Annotated[Path, typer.Option(help="Directory to write the model to (Hugging Face format).")],
    seed: Annotated[int, typer.Option(help="Same seed, byte-identical files.")] = 0,
    context: Annotated[int, typer.Option(min=256, max=1_048_576, help=(
        "Context length in tokens (prompt and answer). Claude Code's and Codex's prompts are 20-30 thousand of "
        "this tokenizer's tokens: give them 32768."))] = 4096,
) -> None:
    """A tiny random Qwen2 model and a byte-level BPE tokenizer trained on a generated corpus."""
    from tether.tiny_model import init_tiny

    with console.status(f"Building the tiny model (seed {seed}, context {context})..."):
        init_tiny(out, seed, context=context)
    typer.echo(f"Tiny model written to {out}", err=True)


@engine_app.command("serve")
def engine_serve(
    model: Annotated[str | None, typer.Option(help="Model directory or Hugging Face name.")] = None,
    host: Annotated[str | None, typer.Option()] = None,
    port: Annotated[int | None, typer.Option()] = None,
    device: Annotated[str | None, typer.Option(help="auto, cpu, cuda, cuda:N.")] = None,
) -> None:
    """Serve a model on /v1/completions until interrupted."""
    from engine.serve import serve
    from engine.settings import EngineSettings

    settings = load_settings(EngineSettings, model=model, host=host, port=port, device=device)
    try:
        serve(settings)
    except OSError as exc:
        fail(f"cannot load model {settings.model!r}: {str(exc).splitlines()[0]}")


@gateway_app.command("serve")
def gateway_serve(
    engine: Annotated[list[str] | None, typer.Option(help="Engine URL (repeat for several).")] = None,
    tokenizer: Annotated[Path | None, typer.Option(help="Model directory (tokenizer and chat template).")] = None,
    host: Annotated[str | None, typer.Option()] = None,
    port: Annotated[int | None, typer.Option()] = None,
    run_id: Annotated[str | None, typer.Option(help="The run whose control events this gateway follows.")] = None,
) -> None:
    """Serve the harness APIs until interrupted (settings: TETHER_GATEWAY_*, Kafka: TETHER_BUS_*)."""
    from gateway.serve import serve
    from gateway.settings import DevelopmentKeysExposed, GatewaySettings

    settings = load_settings(GatewaySettings, engines=engine or None, tokenizer=tokenizer, host=host, port=port,
                             run_id=run_id)
    try:
        settings.check_exposure()
    except DevelopmentKeysExposed as exc:
        fail(str(exc), 2)
    if not (settings.tokenizer / "tokenizer.json").is_file():
        fail(f"--tokenizer/TETHER_GATEWAY_TOKENIZER: {settings.tokenizer} has no tokenizer.json"
             " (build a model with `tether model init-tiny`)")
    with failing_cleanly():
        serve(settings)


if __name__ == "__main__":
    app()
