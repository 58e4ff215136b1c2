"""`tether`: one command fronting every service, one module per command group; each imports its service lazily."""

from __future__ import annotations

import logging

import typer

from tether.cli import (
    analytics,
    bus,
    controller,
    engine,
    gateway,
    k8s,
    kafka,
    model,
    processors,
    repro,
    stack,
    swe,
    trainer,
)

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
app.add_typer(kafka.kafka_app, name="kafka", rich_help_panel="Services")
app.add_typer(engine.engine_app, name="engine", rich_help_panel="Services")
app.add_typer(gateway.gateway_app, name="gateway", rich_help_panel="Services")
app.add_typer(controller.controller_app, name="controller", rich_help_panel="Services")
app.add_typer(bus.rollouts_app, name="rollouts", rich_help_panel="Bus")
app.add_typer(processors.processors_app, name="processors", rich_help_panel="Services")
app.add_typer(trainer.trainer_app, name="trainer", rich_help_panel="Services")
app.add_typer(model.model_app, name="model", rich_help_panel="Models")
app.add_typer(bus.topics_app, name="topics", rich_help_panel="Bus")
app.add_typer(bus.events_app, name="events", rich_help_panel="Bus")
app.add_typer(k8s.k8s_app, name="k8s", rich_help_panel="Stack")
app.add_typer(swe.swe_app, name="swe", rich_help_panel="Tasks")

app.command("replay", rich_help_panel="Bus")(bus.replay)
app.command("diverge", rich_help_panel="Bus")(repro.diverge)
app.command("repro", rich_help_panel="Bus")(repro.repro)
app.command("analytics", rich_help_panel="Bus")(analytics.analytics)
app.command("view", rich_help_panel="Bus")(analytics.view)
app.command("up", rich_help_panel="Stack")(stack.stack_up)
app.command("down", rich_help_panel="Stack")(stack.stack_down)
app.command("status", rich_help_panel="Stack")(stack.stack_status)
app.command("demo", rich_help_panel="Stack")(stack.demo)


@app.callback()
def main() -> None:
    # Clients log every refused connection; the user gets our one-line error instead.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
