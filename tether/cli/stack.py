"""`tether up | down | status | demo`: the whole local stack, and the demo job `make run` runs."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from tether.cli.support import failing_cleanly, load_settings


def stack_up() -> None:
    """Start the local stack (Kafka, engine, gateway, processors, trainer); what runs already is left as is."""
    from tether.stack import Stack, StackSettings

    stack = Stack(load_settings(StackSettings))
    with failing_cleanly():
        stack.up(say=lambda line: typer.echo(line, err=True))
    s = stack.settings
    typer.echo(f"stack up for run {s.run_id}: gateway {s.gateway_url}, engine {s.engine_url}, logs {stack.logs}",
               err=True)


def stack_down(keep_kafka: Annotated[bool, typer.Option(help="Leave the broker running.")] = False) -> None:
    """Stop every part of the local stack, Kafka last; nothing is left running."""
    from tether.stack import Stack, StackSettings

    settings = load_settings(StackSettings)
    stack = Stack.recorded(settings) or Stack(settings)  # the stack that runs, as `up` started it
    with failing_cleanly():
        stack.down(say=lambda line: typer.echo(line, err=True), keep_kafka=keep_kafka)


def stack_status() -> None:
    """Which parts of the local stack run, and of which run."""
    from tether.stack import Stack, StackSettings

    settings = load_settings(StackSettings)
    stack = Stack.recorded(settings)
    if stack is None:
        kafka = Stack(settings).broker.pid()
        typer.echo(f"no stack started under {settings.home} (`tether up` starts one); "
                   f"Kafka: {f'pid {kafka}' if kafka else 'not running'}")
        return
    console = Console()
    console.print(f"stack of run {stack.settings.run_id} under {settings.home}", soft_wrap=True)
    table = Table()
    table.add_column("part")
    table.add_column("pid")
    table.add_row("kafka", str(stack.broker.pid() or "-"))
    for name, pid in stack.status().items():
        table.add_row(name, str(pid or "-"))
    console.print(table)


def demo(task: Annotated[str | None, typer.Option(
        help="letters (one call, `make run`) or lookup (one to three lookups: calls per rollout vary); each has "
             "its preset of settings. Default: TETHER_DEMO_TASK, else letters.")] = None,
         backend: Annotated[str | None, typer.Option(
             help="torch (the embedded learner) or verl (verl's workers on Ray). Default: TETHER_DEMO_BACKEND, "
                  "else torch.")] = None,
         images: Annotated[bool | None, typer.Option(
             "--images", help="Every service, and the broker, in a container of its own from the images (`make "
                              "images`), meeting over the network (TETHER_DEMO_IMAGES).")] = None) -> None:
    """The demo training job (`make run`): warm-start, stack up, an agent trained with RL while held-out tasks
    are validated, summary, stack down."""
    from tether.demo import DemoSettings
    from tether.demo import main as run_demo

    settings = load_settings(DemoSettings, task=task, backend=backend, images=images)
    with failing_cleanly():
        raise typer.Exit(run_demo(settings, Console()))

