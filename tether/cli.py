"""`tether`: one command fronting every service; each group imports its service lazily."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import typer
from pydantic import ValidationError
from pydantic_settings import BaseSettings
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from infra.kafka.launcher import KafkaBroker
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
kafka_app = typer.Typer(help="The local Apache Kafka broker (single node, KRaft).", no_args_is_help=True)
topics_app = typer.Typer(help="The topic catalogue on the bus.", no_args_is_help=True)
events_app = typer.Typer(help="Events on the bus, decoded.", no_args_is_help=True)
engine_app = typer.Typer(help="The embedded inference engine (vLLM-compatible completions).", no_args_is_help=True)
gateway_app = typer.Typer(help="The gateway harnesses call (OpenAI and Anthropic APIs); records every call.",
                          no_args_is_help=True)
controller_app = typer.Typer(help="The rollout controller: runs K harness rollouts per task.", no_args_is_help=True)
rollouts_app = typer.Typer(help="Rollouts of a run, as tether.rollouts records them.", no_args_is_help=True)
processors_app = typer.Typer(help="Stream processors: calls joined to rollouts, task groups, analytics sink.",
                             no_args_is_help=True)
trainer_app = typer.Typer(help="The trainer: task groups in, weight versions out.", no_args_is_help=True)
model_app = typer.Typer(help="Models: build the tiny one the tests and the demo use.", no_args_is_help=True)
app.add_typer(kafka_app, name="kafka", rich_help_panel="Services")
app.add_typer(engine_app, name="engine", rich_help_panel="Services")
app.add_typer(gateway_app, name="gateway", rich_help_panel="Services")
app.add_typer(controller_app, name="controller", rich_help_panel="Services")
app.add_typer(rollouts_app, name="rollouts", rich_help_panel="Bus")
app.add_typer(processors_app, name="processors", rich_help_panel="Services")
app.add_typer(trainer_app, name="trainer", rich_help_panel="Services")
app.add_typer(model_app, name="model", rich_help_panel="Models")
app.add_typer(topics_app, name="topics", rich_help_panel="Bus")
app.add_typer(events_app, name="events", rich_help_panel="Bus")

console = Console(stderr=True)
S = TypeVar("S", bound=BaseSettings)


@app.command("up", rich_help_panel="Stack")
def stack_up() -> None:
    """Start the local stack (Kafka, engine, gateway, processors, trainer); what runs already is left as is."""
    from tether.stack import Stack, StackSettings

    stack = Stack(load_settings(StackSettings))
    with failing_cleanly():
        stack.up(say=lambda line: typer.echo(line, err=True))
    s = stack.settings
    typer.echo(f"stack up for run {s.run_id}: gateway {s.gateway_url}, engine {s.engine_url}, logs {stack.logs}",
               err=True)


@app.command("down", rich_help_panel="Stack")
def stack_down(keep_kafka: Annotated[bool, typer.Option(help="Leave the broker running.")] = False) -> None:
    """Stop every part of the local stack, Kafka last; nothing is left running."""
    from tether.stack import Stack, StackSettings

    with failing_cleanly():
        Stack(load_settings(StackSettings)).down(say=lambda line: typer.echo(line, err=True), keep_kafka=keep_kafka)


@app.command("status", rich_help_panel="Stack")
def stack_status() -> None:
    """Which parts of the local stack run."""
    from tether.stack import Stack, StackSettings

    stack = Stack(load_settings(StackSettings))
    table = Table(title=f"stack of run {stack.settings.run_id}")
    table.add_column("part")
    table.add_column("pid")
    table.add_row("kafka", str(stack.broker.pid() or "-"))
    for name, pid in stack.status().items():
        table.add_row(name, str(pid or "-"))
    Console().print(table)


@app.command("demo", rich_help_panel="Stack")
def demo() -> None:
    """The demo training job (`make run`): warm-start, stack up, an agent trained with RL, summary, stack down."""
    from tether.demo import DemoSettings
    from tether.demo import main as run_demo

    settings = load_settings(DemoSettings)
    with failing_cleanly():
        raise typer.Exit(run_demo(settings, Console()))


@app.callback()
def main() -> None:
    # Clients log every refused connection; the user gets our one-line error instead.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)


def fail(message: str, code: int = 1) -> NoReturn:
    typer.echo(f"tether: {message}", err=True)
    raise typer.Exit(code)


@contextmanager
def failing_cleanly() -> Iterator[None]:
    """Our own errors become one unwrapped line on stderr and exit code 1, never a traceback."""
    from infra.errors import InfraError
    from schemas.errors import BusError

    try:
        yield
    except (InfraError, BusError) as exc:
        fail(str(exc))


def load_settings(cls: type[S], **overrides: Any) -> S:
    """Settings from the environment (and flags); a bad value is named by its variable, in one line."""
    try:
        return cls(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        prefix = str(cls.model_config.get("env_prefix", ""))
        fail(f"{prefix}{field.upper()} (or --{field.replace('_', '-')}): {first['msg']}", 2)


def _broker() -> KafkaBroker:
    from infra.kafka.launcher import KafkaBroker
    from infra.kafka.settings import BrokerSettings

    return KafkaBroker(load_settings(BrokerSettings))


@kafka_app.command("up")
def kafka_up() -> None:
    """Fetch (first time), format (first time) and start the broker; wait until it answers."""
    broker = _broker()
    with failing_cleanly(), console.status(f"Starting Kafka {broker.settings.version} on {broker.bootstrap}..."):
        pid = broker.start()
    typer.echo(f"Kafka {broker.settings.version} ready on {broker.bootstrap} (pid {pid})", err=True)


@kafka_app.command("down")
def kafka_down(force: Annotated[bool, typer.Option(help="SIGKILL instead of a clean shutdown.")] = False) -> None:
    """Stop the broker by its PID."""
    broker = _broker()
    with failing_cleanly():
        stopped = broker.stop(force=force)
    typer.echo("Kafka stopped." if stopped else "Kafka was not running.", err=True)


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
    typer.echo(f"Kafka {broker.settings.version} jars in {libs}", err=True)


@kafka_app.command("wipe")
def kafka_wipe() -> None:
    """Delete the broker's data (topics and offsets); it must be stopped."""
    broker = _broker()
    with failing_cleanly():
        broker.wipe()
    typer.echo(f"Wiped {broker.data_dir}", err=True)


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
) -> None:
    """A tiny random Qwen2 model and a byte-level BPE tokenizer trained on a generated corpus."""
    from trainer.tiny_model import init_tiny

    with console.status(f"Building the tiny model (seed {seed})..."):
        init_tiny(out, seed)
    typer.echo(f"Tiny model written to {out}", err=True)


@engine_app.command("serve")
def engine_serve(
    model: Annotated[str | None, typer.Option(help="Model directory or Hugging Face name.")] = None,
    host: Annotated[str | None, typer.Option()] = None,
    port: Annotated[int | None, typer.Option()] = None,
    device: Annotated[str | None, typer.Option(help="auto, cpu, cuda, cuda:N.")] = None,
) -> None:
    """Serve a model on /v1/completions until interrupted."""
    from trainer.engine.serve import serve
    from trainer.engine.settings import EngineSettings

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
    from gateway.settings import GatewaySettings

    settings = load_settings(GatewaySettings, engines=engine or None, tokenizer=tokenizer, host=host, port=port,
                             run_id=run_id)
    if not (settings.tokenizer / "tokenizer.json").is_file():
        fail(f"--tokenizer/TETHER_GATEWAY_TOKENIZER: {settings.tokenizer} has no tokenizer.json"
             " (build a model with `tether model init-tiny`)")
    with failing_cleanly():
        serve(settings)


@controller_app.command("run")
def controller_run(
    config: Annotated[Path, typer.Argument(help="The run's YAML file (dataset, group size, harness, runner...).")],
) -> None:
    """Launch K rollouts per task until every task group is done; Ctrl-C cancels what runs (resumable)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from controller.config import load_config
    from controller.controller import Controller
    from controller.errors import ControllerError
    from controller.main import run
    from controller.settings import ControllerSettings

    settings = load_settings(ControllerSettings)
    try:
        cfg = load_config(config)
    except ControllerError as exc:
        fail(str(exc), 2)
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[detail]}"), TimeElapsedColumn(), console=console)
    bar = progress.add_task(f"run {cfg.run_id}", total=None, detail="")

    def tick(c: Controller) -> None:
        finished = [s for s in c.view.rollouts.values() if s.finished is not None]
        counted = [s for s in finished if s.finished and s.finished.status in ("succeeded", "failed", "timeout")]
        rewards = [s.finished.reward for s in counted if s.finished and s.finished.reward is not None]
        mean = f"mean reward {sum(rewards) / len(rewards):.3f}" if rewards else "no rewards yet"
        progress.update(bar, total=len(c.tasks) * cfg.group_size, completed=len(counted),
                        detail=f"running {len(c.view.running())} · finished {len(finished)} · {mean}")

    with failing_cleanly(), progress:
        try:
            view = asyncio.run(run(cfg, settings, tick))
        except ControllerError as exc:
            fail(str(exc))
    done = sum(1 for t in view.slots if view.group_done(t))
    typer.echo(f"run {cfg.run_id}: {done} task groups done; logs in {cfg.run_dir}", err=True)


@rollouts_app.command("ls")
def rollouts_ls(run: Annotated[str, typer.Option("--run", help="The run id.")]) -> None:
    """Every rollout of a run: task, attempt, status, reward, duration."""
    from controller.history import read_run
    from schemas.settings import BusSettings

    settings = load_settings(BusSettings)
    with failing_cleanly():
        view = asyncio.run(read_run(settings, run))
    table = Table(title=f"rollouts of run {run}")
    for column in ("rollout", "task", "attempt", "status", "exit", "reward", "seconds", "reason"):
        table.add_column(column)
    for rid, state in sorted(view.rollouts.items()):
        f = state.finished
        table.add_row(rid, state.started.task_id, str(state.started.attempt), f.status if f else "running",
                      "" if f is None or f.exit_code is None else str(f.exit_code),
                      "" if f is None or f.reward is None else f"{f.reward:g}",
                      "" if f is None else f"{f.duration_s:.1f}", (f.reason or "") if f else "")
    Console().print(table)


@processors_app.command("run")
def processors_run(
    run_id: Annotated[str | None, typer.Option("--run", help="Only this run's events.")] = None,
) -> None:
    """Join, group and sink until interrupted (settings: TETHER_PROCESSOR_*, Kafka: TETHER_BUS_*)."""
    from faust.worker import Worker

    from schemas.admin import ensure_topics
    from stream_processors.app import create_app, internal_topics
    from stream_processors.settings import ProcessorSettings

    settings = load_settings(ProcessorSettings, run_id=run_id)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    with failing_cleanly():
        asyncio.run(ensure_topics(settings.bus, internal_topics(settings)))
    Worker(create_app(settings), loglevel="warning", quiet=True).execute_from_commandline()


@app.command("replay", rich_help_panel="Bus")
def replay_run(
    run: Annotated[str, typer.Option("--run", help="The run id.")],
    out: Annotated[Path | None, typer.Option(help="Write the task groups here, one JSON object per line.")] = None,
    compare: Annotated[bool, typer.Option(help="Also hash what tether.samples holds for the run.")] = True,
) -> None:
    """Rebuild a run's task groups from tether.calls and tether.rollouts, with a content hash."""
    from rich.progress import Progress

    from schemas.samples import unique_groups
    from stream_processors.grouping import Policy
    from stream_processors.pipeline import compare as compare_groups
    from stream_processors.pipeline import content_hash
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
    if out is not None:
        write_jsonl(groups, out)
        typer.echo(f"wrote {out}")
    if stored is not None:
        same, pending = compare_groups(groups, stored)
        typer.echo(f"samples   sha256 {content_hash(stored)} ({len(stored)} task groups on tether.samples)")
        typer.echo(("identical" if content_hash(stored) == rebuilt else
                    f"identical for the {len(stored)} groups published" if same else
                    "DIFFERENT: see README (a partial group published while a rollout was still coming)")
                   + (f"; {pending} more groups are incomplete (partial in the rebuild)" if pending else ""))


@app.command("analytics", rich_help_panel="Bus")
def analytics(
    run: Annotated[str, typer.Option("--run", help="The run id.")],
    dsn: Annotated[str | None, typer.Option(help="ClickHouse DSN (default: TETHER_PROCESSOR_CLICKHOUSE_DSN).")]
    = None,
    out: Annotated[Path, typer.Option(help="Where to write the plot.")] = Path(".tether/analytics"),
) -> None:
    """Reward per weight version, tokens and calls per rollout, gateway latency, staleness, failures."""
    from stream_processors.analytics import plot, print_results, run_queries
    from stream_processors.errors import ProcessorError
    from stream_processors.settings import ProcessorSettings
    from stream_processors.sink import connect

    target = dsn or load_settings(ProcessorSettings).clickhouse_dsn
    if not target:
        fail("no ClickHouse DSN: pass --dsn or set TETHER_PROCESSOR_CLICKHOUSE_DSN", 2)
    try:
        results = run_queries(connect(target), run)
    except ProcessorError as exc:
        fail(str(exc))
    print_results(results, run, Console(width=max(130, shutil.get_terminal_size().columns)))
    typer.echo(f"plot: {plot(results, run, out / f'{run}.png')}", err=True)


@trainer_app.command("run")
def trainer_run(
    config: Annotated[Path, typer.Argument(help="The trainer's YAML file (run_id, model, batch_groups, lr...).")],
) -> None:
    """Train on the run's task groups as they arrive; pause, update and resume the gateways each B groups."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from schemas.settings import BusSettings
    from trainer.config import load_config as load_trainer_config
    from trainer.errors import TrainerError
    from trainer.loop import Trainer
    from trainer.report import plot_history

    bus = load_settings(BusSettings)
    try:
        cfg = load_trainer_config(config)
    except TrainerError as exc:
        fail(str(exc), 2)
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[detail]}"), TimeElapsedColumn(), console=console)
    bar = progress.add_task(f"updates of {cfg.run_id}", total=cfg.max_updates, detail="waiting for task groups")

    def tick(m: dict[str, float]) -> None:
        progress.update(bar, advance=1, detail=f"v{m['version']:.0f} reward {m['mean_reward']:.3f} "
                                               f"loss {m['loss']:.4f} ({m['task_groups']:.0f} groups)")

    trainer = Trainer(cfg, bus, on_update=tick)
    with failing_cleanly(), progress:
        try:
            state = asyncio.run(trainer.run())
        except TrainerError as exc:
            fail(str(exc))
    if state.history:
        out = plot_history(state.history, cfg.run_dir / "updates.png", f"run {cfg.run_id}")
        typer.echo(f"{len(state.history)} updates, now version {state.version}; plot: {out}", err=True)


if __name__ == "__main__":
    app()
