"""`tether kafka ...`: the local Apache Kafka (KRaft), one broker or a secured cluster, and how services reach it."""

from __future__ import annotations

import dataclasses
import shlex
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from tether.cli.support import console, fail, failing_cleanly, load_settings

if TYPE_CHECKING:
    from infra.kafka.launcher import KafkaBroker

kafka_app = typer.Typer(help="The local Apache Kafka (KRaft): one broker, or a secured cluster of several.",
                        no_args_is_help=True)


def _broker(brokers: int | None = None, security: str | None = None) -> KafkaBroker:
    from infra.kafka.launcher import KafkaBroker
    from infra.kafka.settings import BrokerSettings

    return KafkaBroker(load_settings(BrokerSettings, brokers=brokers, security=security))


@kafka_app.command("up")
def kafka_up(
    brokers: Annotated[int | None, typer.Option(help="KRaft nodes (TETHER_KAFKA_BROKERS); 3: replication factor 3, "
                                                     "min.insync.replicas 2.")] = None,
    security: Annotated[str | None, typer.Option(
        help="plaintext, or sasl_ssl: TLS with the cluster's own CA, a SCRAM user per service, ACLs "
             "(TETHER_KAFKA_SECURITY).")] = None,
) -> None:
    """Fetch (first time), format (first time) and start every node; wait until all answer; create the topic
    catalogue (and, secured, the services' ACLs)."""
    broker = _broker(brokers, security)
    what = f"Kafka {broker.settings.version}, {broker.settings.brokers} node(s), {broker.settings.security}"
    with failing_cleanly(), console.status(f"Starting {what} on {broker.bootstrap}..."):
        pid = broker.start()
    typer.echo(f"{what}: ready on {broker.bootstrap} (pid {pid})", err=True)
    if broker.settings.secured:
        typer.echo("services connect with `eval \"$(tether kafka env SERVICE)\"`", err=True)


@kafka_app.command("serve")
def kafka_serve(
    brokers: Annotated[int | None, typer.Option(help="KRaft nodes (TETHER_KAFKA_BROKERS).")] = None,
    security: Annotated[str | None, typer.Option(help="plaintext or sasl_ssl (TETHER_KAFKA_SECURITY).")] = None,
) -> None:
    """`up` in the foreground, as a container's command: the nodes' logs on stdout until SIGTERM or SIGINT, which
    stop them cleanly (exit 0); a node that dies ends it (exit 1)."""
    import signal
    import threading

    broker = _broker(brokers, security)
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.set())
    with failing_cleanly():
        pid = broker.start()
    typer.echo(f"Kafka {broker.settings.version}: ready on {broker.bootstrap} (pid {pid})", err=True)
    logs = {node.id: node.log_file.open("rb") for node in broker.nodes}
    for log in logs.values():
        log.seek(0, 2)  # from now on: the start is behind us
    try:
        while not stopping.is_set() and all(node.pid() is not None for node in broker.nodes):
            for log in logs.values():
                for line in log.readlines():
                    typer.echo(line.decode(errors="replace").rstrip("\n"))
            stopping.wait(1.0)
    finally:
        for log in logs.values():
            log.close()
    if not stopping.is_set():
        dead = [node.id for node in broker.nodes if node.pid() is None]
        broker.stop()
        fail(f"Kafka node(s) {dead} stopped; their logs: {', '.join(str(n.log_file) for n in broker.nodes)}")
    with failing_cleanly():
        broker.stop()
    typer.echo("Kafka stopped.", err=True)


@kafka_app.command("down")
def kafka_down(
    force: Annotated[bool, typer.Option(help="SIGKILL instead of a clean shutdown.")] = False,
    node: Annotated[int | None, typer.Option(help="Only this node (1-based), the others keep running.")] = None,
) -> None:
    """Stop every node (or one) by its PID."""
    broker = _broker()
    with failing_cleanly():
        stopped = broker.stop(force=force, node=node)
    typer.echo("Kafka stopped." if stopped else "Kafka was not running.", err=True)


@kafka_app.command("status")
def kafka_status() -> None:
    """Running (every node), ready (all brokers registered), where, and which data."""
    status = _broker().status()
    table = Table(show_header=False, box=None)
    for field in dataclasses.fields(status):
        table.add_row(field.name, str(getattr(status, field.name)))
    Console().print(table)
    raise typer.Exit(0 if status.ready else 3)


@kafka_app.command("env")
def kafka_env(service: Annotated[str, typer.Argument(help="gateway, controller, processors, trainer or admin.")]
              ) -> None:
    """TETHER_BUS_* lines that connect SERVICE to this Kafka as its own user: `eval "$(tether kafka env gateway)"`."""
    from infra.kafka.acls import USERS

    broker = _broker()
    if broker.settings.secured and service not in USERS:
        fail(f"no Kafka user {service!r}; the users are {', '.join(USERS)}")
    with failing_cleanly():
        env = broker.client_env(service)
    for name, value in env.items():
        typer.echo(f"export {name}={shlex.quote(value)}")


@kafka_app.command("fetch")
def kafka_fetch() -> None:
    """Download the broker's jars with Maven into the cache (outside git)."""
    broker = _broker()
    with failing_cleanly(), console.status("Fetching Kafka with Maven..."):
        libs = broker.fetch()
    typer.echo(f"Kafka {broker.settings.version} jars in {libs}", err=True)


@kafka_app.command("wipe")
def kafka_wipe() -> None:
    """Delete every node's data (topics and offsets), the certificates and the users; Kafka must be stopped."""
    broker = _broker()
    with failing_cleanly():
        broker.wipe()
    typer.echo(f"Wiped the Kafka data in {broker.state_dir}", err=True)
