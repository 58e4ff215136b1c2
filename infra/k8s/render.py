"""The Kubernetes manifests of the whole system, rendered from the project's own tables: one source of truth.

    python -m infra.k8s.render [--out DIR] [--check] [--namespace NS ...]   (or `tether k8s render`)

What comes from where:

- Strimzi `KafkaTopic`s from the topic catalogue (`schemas/topics.py`: partitions, cleanup policy, retention,
  max.message.bytes) with the replication factor and `min.insync.replicas` that `schemas.admin` gives a
  three-broker cluster; `KafkaUser`s (SCRAM-SHA-512, simple authorization) from the ACL table
  (`infra/kafka/acls.py`), one per service, with exactly its ACLs; an example `Kafka` and `KafkaNodePool` whose
  broker settings are the local secured cluster's (`infra/kafka/config.py`).
- HAProxy's configuration from `infra/loadbalancer.py` (the same rules: hash on the rollout from the path or
  the token, consistent hashing, health checks, resending failed connections), its servers being the gateway
  StatefulSet's pods by their stable DNS names.
- Every workload's environment from the services' settings (`TETHER_*`), its Kafka user from the ACL table,
  and names, labels and ports from the constants below, so that Services, the NetworkPolicy, the HAProxy
  servers, the RoleBinding and the run file agree.

`infra/k8s/job-template.yaml` is written by hand (it is the harness's Job); the run's ConfigMap copies it.
`tests/test_k8s_*.py` check that the committed files equal a fresh render, and validate them against the
Kubernetes API's schemas and Strimzi's CRD schemas (`strimzi/schemas/`, made by `--strimzi-schemas` from Strimzi's
own CRD generator on Maven Central: crd_schemas.py).

This module is the entry point: which file holds which resources, writing or checking them, and the command line.
The names and options every manifest shares are in options.py, the YAML writing in yaml_text.py, the pieces of
every workload in pieces.py, and the resources themselves in resources/ (strimzi, namespace, gateway, workers,
controller).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from infra.k8s.crd_schemas import strimzi_schemas
from infra.k8s.options import DEFAULT, HERE, Options
from infra.k8s.resources.controller import controller, controller_run
from infra.k8s.resources.gateway import gateway, gateway_lb
from infra.k8s.resources.namespace import config_map, models_claim, namespace, network_policy
from infra.k8s.resources.strimzi import kafka_cluster, kafka_topic, kafka_user
from infra.k8s.resources.workers import processors, trainer
from infra.k8s.yaml_text import dump, header, yaml_file
from infra.kafka import acls
from schemas.topics import CATALOGUE

#: What `from infra.k8s.render import ...` gives: the files, the command, and the options they take.
__all__ = ["BASE", "DEFAULT", "Options", "main", "options_parser", "render", "stale", "write"]


BASE = ("namespace.yaml", "config.yaml", "gateway.yaml", "gateway-lb.yaml", "processors.yaml", "trainer.yaml",
        "controller.yaml", "network-policy.yaml")


#: the images the services' manifests run (the broker's image is for a stack on one machine: Strimzi runs Kafka)
TETHER_ROLES = ("gateway", "processors", "controller", "trainer")


def _kustomization(resources: Sequence[str], note: str, o: Options, images: bool) -> str:
    doc: dict[str, Any] = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                           "resources": list(resources)}
    if images:  # point these at your registry and tag
        doc["images"] = [{"name": name, "newName": name, "newTag": tag} for name, _, tag in
                         (o.image(role).rpartition(":") for role in TETHER_ROLES)]
    return header(note) + dump(doc)


def render(o: Options = DEFAULT) -> dict[str, str]:
    """Every generated file, by its path under infra/k8s/."""
    run = controller_run(o)
    return {
        "namespace.yaml": yaml_file("The namespace.", [namespace(o)]),
        "config.yaml": yaml_file("Configuration and the model volume.", [config_map(o), models_claim(o)]),
        "gateway.yaml": yaml_file("The gateway replicas.", gateway(o)),
        "gateway-lb.yaml": yaml_file("HAProxy in front of the gateway replicas: rollout affinity.", gateway_lb(o)),
        "processors.yaml": yaml_file("The stream processors.", processors(o)),
        "trainer.yaml": yaml_file("The trainer and the engine.", trainer(o)),
        "controller.yaml": yaml_file(
            "What a run's controller may do in the cluster (its Job: run/controller.yaml).", controller(o)),
        "network-policy.yaml": yaml_file("Rollouts reach only the gateway.", [network_policy(o)]),
        "kustomization.yaml": _kustomization(
            BASE, "Tether's services: `kubectl apply -k infra/k8s` (after strimzi/, see docs/deployment.md).", o,
            images=True),
        "run/input.yaml": yaml_file(
            "An example run's input (`kubectl apply -f`, or make your own: docs/deployment.md).", run[:1]),
        "run/controller.yaml": yaml_file("One run's controller (`kubectl apply -f`, once per run).", run[1:]),
        "strimzi/kafka.yaml": yaml_file("A Kafka cluster through Strimzi, if you have none (needs Strimzi 0.49+, "
                                        "for the kafka.strimzi.io/v1 API).", kafka_cluster(o)),
        "strimzi/topics.yaml": yaml_file("The topic catalogue (schemas/topics.py) as Strimzi KafkaTopics.",
                                         [kafka_topic(t, o) for t in CATALOGUE]),
        "strimzi/users.yaml": yaml_file(
            "One Kafka user per service (infra/kafka/acls.py) as Strimzi KafkaUsers: SCRAM-SHA-512, and exactly "
            "the ACLs of the table. The User Operator keeps each password in a Secret named after the user. "
            f"No `{acls.ADMIN}` user: the Topic Operator creates the topics from topics.yaml.",
            [kafka_user(u, o) for u in acls.SERVICES]),
        "strimzi/kustomization.yaml": _kustomization(
            ("topics.yaml", "users.yaml"), "Topics and users: `kubectl apply -k infra/k8s/strimzi`.", o,
            images=False),
    }


def write(out: Path, o: Options = DEFAULT) -> list[Path]:
    written = []
    for name, text in render(o).items():
        path = out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written


def stale(out: Path, o: Options = DEFAULT) -> list[str]:
    """The generated files under `out` that differ from a fresh render (or are missing)."""
    return [name for name, text in render(o).items()
            if not (out / name).is_file() or (out / name).read_text() != text]


def options_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    for f in fields(Options):
        parser.add_argument(f"--{f.name.replace('_', '-')}", type=type(getattr(DEFAULT, f.name)),
                            default=getattr(DEFAULT, f.name))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.k8s.render", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=HERE, help="Where to write (default: infra/k8s).")
    parser.add_argument("--check", action="store_true", help="Write nothing; exit 1 if a file differs.")
    parser.add_argument("--strimzi-schemas", action="store_true",
                        help="Regenerate strimzi/schemas/ with Maven and Java 21+ (needs Maven Central).")
    args = options_parser(parser).parse_args(argv)
    if args.strimzi_schemas:
        for path in strimzi_schemas():
            print(path)
        return 0
    o = Options(**{f.name: getattr(args, f.name) for f in fields(Options)})
    try:
        if args.check:
            differ = stale(args.out, o)
            for name in differ:
                print(f"{args.out / name}: differs from a fresh render", file=sys.stderr)
            return 1 if differ else 0
        for path in write(args.out, o):
            print(path)
    except ValueError as exc:
        print(f"render: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
