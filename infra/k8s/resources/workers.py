"""The run's workers: the stream processors (one Faust consumer group, as many replicas as the partitions allow)
and the trainer collocated with the engine (a StatefulSet of one, sharing the checkpoint volume). Kept apart from
the gateway and the controller: they talk to those only through Kafka and the engine's Service."""

from __future__ import annotations

from typing import Any

from infra.k8s.options import (
    CA_DIR,
    CHECKPOINTS,
    CLICKHOUSE,
    ENGINE,
    ENGINE_PORT,
    MODELS_DIR,
    PROCESSORS,
    TRAINER,
    TRAINER_DIR,
    Doc,
    Options,
)
from infra.k8s.pieces import (
    STATE_VOLUME,
    anti_affinity,
    bus_env,
    ca_volume,
    http_probe,
    labels,
    meta,
    models_volume,
    mount,
    pod_security,
    secret_env,
    tether_container,
)
from infra.k8s.yaml_text import dump
from schemas.topics import CALLS


def processors(o: Options) -> list[Doc]:
    if not 1 <= o.processor_replicas <= CALLS.partitions:
        raise ValueError(f"processor replicas must be 1..{CALLS.partitions} (the partitions of {CALLS.name})")
    env = [*bus_env("processors"),
           secret_env("TETHER_PROCESSOR_CLICKHOUSE_DSN", CLICKHOUSE, "dsn", optional=True)]
    container = tether_container(
        "processors", o, "processors", env, [mount("kafka-ca", CA_DIR)],
        {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "4Gi"}})
    return [(
        f"Stream processors: Faust workers of one consumer group (TETHER_PROCESSOR_APP_ID) sharing the partitions. "
        f"A partition has one reader in a group, so replicas beyond the {CALLS.partitions} partitions of "
        f"{CALLS.name} (and tether.rollouts) would idle; beyond 4 the grouping stage (tether.samples' 4 partitions) "
        "has idle workers already. Their tables are in memory, restored from changelog topics; a rolling update "
        "adds no pod before one is gone (maxSurge 0).", {
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta(PROCESSORS, o, "processors"),
            "spec": {
                "replicas": o.processor_replicas, "selector": {"matchLabels": labels("processors")},
                "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
                "template": {
                    "metadata": {"labels": labels("processors")},
                    "spec": {
                        "automountServiceAccountToken": False,
                        "securityContext": pod_security(),
                        "affinity": anti_affinity("processors"),
                        "containers": [container],
                        "volumes": [ca_volume(o), STATE_VOLUME],
                    }}}})]


def trainer_config(o: Options) -> dict[str, Any]:
    return {"run_id": o.run_id, "model": o.model_dir, "checkpoint_dir": CHECKPOINTS,
            "engine_url": f"http://127.0.0.1:{ENGINE_PORT}", "batch_groups": 8, "device": "cuda"}


def trainer(o: Options) -> list[Doc]:
    engine = tether_container(
        "engine", o, "trainer", [],
        [mount("models", MODELS_DIR), mount("checkpoints", CHECKPOINTS)],
        {"requests": {"cpu": "4", "memory": "32Gi"}, "limits": {"memory": "32Gi", "nvidia.com/gpu": 1}},
        command=["tether", "engine", "serve"],  # the trainer's image serves the embedded engine too
        ports=[{"name": "http", "containerPort": ENGINE_PORT}],
        startupProbe=http_probe("/health", "http", 5, 120),  # loading the model
        readinessProbe=http_probe("/health", "http", 5, 2),
        livenessProbe=http_probe("/health", "http", 10, 6, timeout=5),
    )
    learner = tether_container(
        "trainer", o, "trainer", bus_env("trainer"),
        [mount("kafka-ca", CA_DIR), mount("models", MODELS_DIR), mount("config", TRAINER_DIR),
         mount("checkpoints", CHECKPOINTS, read_only=False)],
        {"requests": {"cpu": "4", "memory": "32Gi"}, "limits": {"memory": "64Gi", "nvidia.com/gpu": 1}})
    return [
        ("The trainer's file (trainer/config.py): one run, collocated with the engine in its pod.", {
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": meta(TRAINER, o, "trainer"),
            "data": {"trainer.yaml": dump(trainer_config(o))}}),
        ("Trainer and engine, collocated: the engine serves the run's completions and loads each version the "
         "trainer commits, from the checkpoint volume they share. A StatefulSet of one: never two trainers of a "
         "run (a Deployment may run two during a rollout), and the same checkpoint volume after a restart, from "
         "whose LATEST the trainer resumes. With vLLM servers instead, use backend: verl (docs/deployment.md).", {
             "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": meta(TRAINER, o, "trainer"),
             "spec": {
                 "serviceName": ENGINE, "replicas": 1, "selector": {"matchLabels": labels("trainer")},
                 "template": {
                     "metadata": {"labels": labels("trainer")},
                     "spec": {
                         "automountServiceAccountToken": False,
                         "securityContext": pod_security(),
                         "containers": [engine, learner],
                         "volumes": [ca_volume(o), models_volume(),
                                     {"name": "config", "configMap": {"name": TRAINER}}, STATE_VOLUME],
                     }},
                 "volumeClaimTemplates": [{
                     "metadata": {"name": "checkpoints", "labels": labels("trainer")},
                     "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "200Gi"}}}}],
             }}),
        ("The engine's address (TETHER_GATEWAY_ENGINES).", {
            "apiVersion": "v1", "kind": "Service", "metadata": meta(ENGINE, o, "trainer"),
            "spec": {"selector": labels("trainer"),
                     "ports": [{"name": "http", "port": ENGINE_PORT, "targetPort": "http"}]}}),
    ]
