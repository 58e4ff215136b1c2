"""What the namespace holds for every service rather than one: the Namespace itself (its Pod Security level),
tether-config (every service's TETHER_* settings), the model volume, and the NetworkPolicy that confines the
rollout pods to the gateway. Kept apart from the workloads, which only refer to these by name."""

from __future__ import annotations

import json

from infra.k8s.options import (
    CA_DIR,
    CLICKHOUSE,
    CONFIG,
    ENGINE,
    ENGINE_PORT,
    GATEWAY,
    MODELS,
    PORT,
    STATE_DIR,
    Doc,
    Options,
)
from infra.k8s.pieces import labels, meta
from infra.kafka import acls


def namespace(o: Options) -> Doc:
    return ("Tether's namespace: its services, the rollout Jobs, the Kafka cluster and its users. Pods must meet "
            "the baseline Pod Security Standard (a harness image may run as it was built); Tether's own meet "
            "restricted.", {
                "apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": o.namespace, "labels": {
                    "app.kubernetes.io/part-of": "tether", "pod-security.kubernetes.io/enforce": "baseline",
                    "pod-security.kubernetes.io/warn": "restricted"}}})


def config_map(o: Options) -> Doc:
    data = {
        "TETHER_BUS_BOOTSTRAP_SERVERS": o.bootstrap,
        "TETHER_BUS_SECURITY_PROTOCOL": "SASL_SSL",
        "TETHER_BUS_SASL_MECHANISM": "SCRAM-SHA-512",
        "TETHER_BUS_CA_FILE": f"{CA_DIR}/ca.crt",
        "TETHER_BUS_REPLICATION_FACTOR": str(o.replication_factor),
        "TETHER_GATEWAY_RUN_ID": o.run_id,
        "TETHER_GATEWAY_HOST": "0.0.0.0",
        "TETHER_GATEWAY_PORT": str(PORT),
        "TETHER_GATEWAY_ENGINES": json.dumps([o.service_url(ENGINE, ENGINE_PORT)]),
        "TETHER_GATEWAY_TOKENIZER": o.model_dir,
        "TETHER_CONTROLLER_GATEWAY_URL": o.service_url(GATEWAY, PORT),
        "TETHER_CONTROLLER_HARNESS_GATEWAY_URL": o.service_url(GATEWAY, PORT),
        "TETHER_PROCESSOR_APP_ID": f"{acls.PROCESSOR_PREFIX}-{o.run_id}",
        "TETHER_PROCESSOR_RUN_ID": o.run_id,
        "TETHER_PROCESSOR_DATA_DIR": f"{STATE_DIR}/processor",
        "TETHER_PROCESSOR_CLICKHOUSE_DSN": "",
        "TETHER_ENGINE_MODEL": o.model_dir,
        "TETHER_ENGINE_HOST": "0.0.0.0",
        "TETHER_ENGINE_PORT": str(ENGINE_PORT),
        "TETHER_ENGINE_DEVICE": "cuda",
        "TETHER_ENGINE_DTYPE": "bfloat16",
    }
    return ("Every service's settings (each reads its own TETHER_* prefix); secrets come from Secrets, never from "
            "here. TETHER_PROCESSOR_CLICKHOUSE_DSN is empty (no analytics sink) unless the optional Secret "
            f"{CLICKHOUSE} holds a ClickHouse URL under `dsn`.",
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta(CONFIG, o, "config"), "data": data})


def models_claim(o: Options) -> Doc:
    return (f"The model folder (weights, tokenizer.json, tokenizer_config.json, chat template) at {o.model_dir}: "
            "the gateways' tokenizer, the engine's and the trainer's starting weights. Copy the model into it once "
            "(docs/deployment.md); it needs a storage class that mounts on several nodes.", {
                "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta(MODELS, o, "models"),
                "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "50Gi"}}}})


def network_policy(o: Options) -> Doc:
    reachable = {"matchExpressions": [{"key": "app.kubernetes.io/name", "operator": "In",
                                       "values": [labels("gateway-lb")["app.kubernetes.io/name"],
                                                  labels("gateway")["app.kubernetes.io/name"]]}]}
    return ("Rollout pods may reach the gateway (HAProxy, or a gateway pod) and DNS, nothing else: a harness "
            "cannot reach Kafka, the trainer, the engine, other rollouts or the internet. Its pods are the ones "
            "job-template.yaml labels.", {
                "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                "metadata": meta("tether-rollouts-reach-only-the-gateway", o, "rollout"),
                "spec": {
                    "podSelector": {"matchLabels": {"app.kubernetes.io/part-of": "tether",
                                                    "app.kubernetes.io/component": "rollout"}},
                    "policyTypes": ["Ingress", "Egress"],
                    "ingress": [],
                    "egress": [
                        {"to": [{"podSelector": reachable}], "ports": [{"protocol": "TCP", "port": PORT}]},
                        {"to": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
                         "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]},
                    ]}})
