"""`tether k8s render`: the Kubernetes manifests of the whole system, from the topic catalogue, the ACL table and
the services' settings (infra/k8s/render.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tether.cli.support import fail

k8s_app = typer.Typer(help="Kubernetes manifests of the whole system (Strimzi topics and users included).",
                      no_args_is_help=True)


@k8s_app.callback()
def k8s() -> None:
    """Kubernetes manifests of the whole system (Strimzi topics and users included)."""


@k8s_app.command("render")
def k8s_render(
    out: Annotated[Path, typer.Option(help="Where to write them.")] = Path("infra/k8s"),
    namespace: Annotated[str, typer.Option(help="Everything goes in this namespace.")] = "tether",
    run_id: Annotated[str, typer.Option(help="The run the gateways, processors, trainer and controller serve.")]
    = "my-run",
    registry: Annotated[str, typer.Option(help="Where Tether's images are (tether-gateway, tether-processors, "
                                               "tether-controller, tether-trainer: `make images`).")]
    = "ghcr.io/example",
    tag: Annotated[str, typer.Option(help="Their tag.")] = "0.1.0",
    kafka_cluster: Annotated[str, typer.Option(help="The Strimzi Kafka resource's name.")] = "tether",
    gateway_replicas: Annotated[int, typer.Option(min=1)] = 2,
    gateway_slots: Annotated[int, typer.Option(min=1, help="HAProxy servers: the most gateway replicas it "
                                                            "routes to without rendering again.")] = 8,
    processor_replicas: Annotated[int, typer.Option(min=1, help="At most the partitions of tether.calls.")] = 2,
    check: Annotated[bool, typer.Option(help="Write nothing; fail if a file under --out differs.")] = False,
) -> None:
    """Write the manifests (or, with --check, compare them with what is there)."""
    from infra.k8s.render import Options, stale, write

    try:
        options = Options(namespace=namespace, run_id=run_id, registry=registry, tag=tag, kafka_cluster=kafka_cluster,
                          gateway_replicas=gateway_replicas, gateway_slots=gateway_slots,
                          processor_replicas=processor_replicas)
        if check:
            differ = stale(out, options)
            if differ:
                fail(f"{', '.join(differ)} under {out} differ from a fresh render: run `tether k8s render`")
            typer.echo(f"{out}: up to date", err=True)
            return
        written = write(out, options)
    except ValueError as exc:
        fail(str(exc), 2)
    typer.echo(f"Wrote {len(written)} files under {out}.", err=True)
