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
`tests/test_k8s_manifests.py` checks that the committed files equal a fresh render, and validates them against
the Kubernetes API's schemas and Strimzi's CRD schemas (`strimzi/schemas/`, made by `--strimzi-schemas` from
Strimzi's own CRD generator on Maven Central).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from infra import loadbalancer
from infra.kafka import acls
from infra.kafka.config import server_properties
from infra.kafka.settings import BrokerSettings
from schemas.settings import min_insync_replicas
from schemas.topics import CALLS, CATALOGUE, Topic

HERE = Path(__file__).resolve().parent
JOB_TEMPLATE = HERE / "job-template.yaml"
STRIMZI = HERE / "strimzi"
STRIMZI_SCHEMAS = STRIMZI / "schemas"
STRIMZI_API = "kafka.strimzi.io/v1"
#: The Strimzi kinds rendered here, and the CRD generator's Java class of each (for --strimzi-schemas).
STRIMZI_KINDS = {
    "Kafka": "io.strimzi.api.kafka.model.kafka.Kafka",
    "KafkaNodePool": "io.strimzi.api.kafka.model.nodepool.KafkaNodePool",
    "KafkaTopic": "io.strimzi.api.kafka.model.topic.KafkaTopic",
    "KafkaUser": "io.strimzi.api.kafka.model.user.KafkaUser",
}

# Names, ports and paths every manifest shares.
CONFIG = "tether-config"
GATEWAY = "tether-gateway"  # the Service harnesses and the controller call: HAProxy's pods
GATEWAY_REPLICAS = "tether-gateway-replica"  # the StatefulSet of gateways; pods tether-gateway-replica-N
GATEWAY_PEERS = "tether-gateway-replicas"  # its headless Service: one DNS name per pod, for HAProxy
GATEWAY_LB = "tether-gateway-lb"
GATEWAY_KEYS = "tether-gateway-keys"  # Secret you create: `secret`, `admin-key`
ENGINE = "tether-engine"
TRAINER = "tether-trainer"
PROCESSORS = "tether-processors"
CONTROLLER = "tether-controller"
RUN = "tether-run"
MODELS = "tether-models"
CLICKHOUSE = "tether-clickhouse"  # optional Secret you create: `dsn`
PORT = 8000  # the gateway's (and HAProxy's) HTTP port
ENGINE_PORT = 8100
LB_HEALTH_PORT = 8404
CA_DIR = "/etc/tether/kafka-ca"
MODELS_DIR = "/models"
STATE_DIR = "/var/lib/tether"
RUN_DIR = "/etc/tether/run"
TRAINER_DIR = "/etc/tether/trainer"
CHECKPOINTS = f"{STATE_DIR}/checkpoints"
USER_ID = 10001
HAPROXY_USER_ID = 99  # the official haproxy image's `haproxy` user


@dataclass(frozen=True)
class Options:
    """What a platform team may change by rendering again; the committed files use the defaults."""

    namespace: str = "tether"
    run_id: str = "my-run"
    image: str = "ghcr.io/example/tether:0.1.0"
    haproxy_image: str = "docker.io/library/haproxy:3.2"
    kafka_cluster: str = "tether"
    kafka_brokers: int = 3
    gateway_replicas: int = 2
    gateway_slots: int = 8  # HAProxy servers listed: the most gateway replicas without rendering again
    lb_replicas: int = 2
    processor_replicas: int = 2
    model_dir: str = f"{MODELS_DIR}/model"
    cluster_domain: str = "cluster.local"

    @property
    def replication_factor(self) -> int:
        return min(self.kafka_brokers, 3)

    @property
    def bootstrap(self) -> str:
        return f"{self.kafka_cluster}-kafka-bootstrap.{self.namespace}.svc:9093"

    @property
    def ca_secret(self) -> str:
        return f"{self.kafka_cluster}-cluster-ca-cert"

    def service_url(self, service: str, port: int) -> str:
        return f"http://{service}.{self.namespace}.svc:{port}"

    def pod_dns(self, index: int) -> str:
        return f"{GATEWAY_REPLICAS}-{index}.{GATEWAY_PEERS}.{self.namespace}.svc.{self.cluster_domain}"


DEFAULT = Options()
Doc = tuple[str, dict[str, Any]]  # (comment, resource)


# -- YAML --------------------------------------------------------------------------------------------------------

class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True  # a shared piece is written out wherever it appears, never as an anchor

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)  # lists indented under their key


def _str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|" if "\n" in data else None)


_Dumper.add_representer(str, _str)


def dump(value: Any) -> str:
    return yaml.dump(value, Dumper=_Dumper, sort_keys=False, width=120, allow_unicode=True)


def _comment(text: str) -> str:
    """`text` as YAML comment lines, each paragraph wrapped."""
    lines = [line for paragraph in text.strip().split("\n\n")
             for line in (textwrap.wrap(paragraph, 116, break_on_hyphens=False) or [""]) + [""]][:-1]
    return "".join(f"# {line}".rstrip() + "\n" for line in lines) if text.strip() else ""


def _file(header: str, docs: Sequence[Doc]) -> str:
    head = _comment(header + "\n\nGenerated by infra/k8s/render.py (`tether k8s render`): edit that, not this file.")
    return head + "".join(f"---\n{_comment(note)}{dump(doc)}" for note, doc in docs)


# -- shared pieces -----------------------------------------------------------------------------------------------

def labels(component: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": f"tether-{component}", "app.kubernetes.io/part-of": "tether",
            "app.kubernetes.io/component": component}


def _meta(name: str, o: Options, component: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "namespace": o.namespace, "labels": labels(component), **extra}


def _pod_security(user: int = USER_ID) -> dict[str, Any]:
    return {"runAsNonRoot": True, "runAsUser": user, "runAsGroup": user, "fsGroup": user,
            "seccompProfile": {"type": "RuntimeDefault"}}


def _container_security() -> dict[str, Any]:
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def _secret_env(name: str, secret: str, key: str, optional: bool = False) -> dict[str, Any]:
    ref: dict[str, Any] = {"name": secret, "key": key}
    if optional:
        ref["optional"] = True
    return {"name": name, "valueFrom": {"secretKeyRef": ref}}


def _bus_env(user: str) -> list[dict[str, Any]]:
    """The service's Kafka user (the ACL table's name; Strimzi's User Operator keeps its password in a Secret of
    the same name)."""
    if user not in acls.BY_NAME:
        raise ValueError(f"{user} is not in the ACL table")
    return [{"name": "TETHER_BUS_USERNAME", "value": user}, _secret_env("TETHER_BUS_PASSWORD", user, "password"),
            {"name": "TETHER_BUS_CLIENT_ID", "value": f"tether-{user}"}]


def _ca_volume(o: Options) -> dict[str, Any]:
    return {"name": "kafka-ca", "secret": {"secretName": o.ca_secret, "items": [{"key": "ca.crt", "path": "ca.crt"}]}}


def _mount(name: str, path: str, read_only: bool = True) -> dict[str, Any]:
    mount: dict[str, Any] = {"name": name, "mountPath": path}
    if read_only:
        mount["readOnly"] = True
    return mount


def _models_volume() -> dict[str, Any]:
    return {"name": "models", "persistentVolumeClaim": {"claimName": MODELS, "readOnly": True}}


def _container(name: str, o: Options, command: list[str], env: list[dict[str, Any]],
               mounts: list[dict[str, Any]], resources: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A Tether container: settings from tether-config, and a writable folder (the pod's `state` emptyDir) as
    its working directory and HOME (relative `.tether/` paths, library caches), the image's own being read-only
    to its user."""
    return {"name": name, "image": o.image, "command": command, "workingDir": STATE_DIR,
            "envFrom": [{"configMapRef": {"name": CONFIG}}], "env": [{"name": "HOME", "value": STATE_DIR}, *env],
            **extra, "volumeMounts": [_mount("state", STATE_DIR, read_only=False), *mounts],
            "resources": resources, "securityContext": _container_security()}


STATE_VOLUME = {"name": "state", "emptyDir": {}}


def _http_probe(path: str, port: str | int, period: int, failures: int, timeout: int = 1) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": port}, "periodSeconds": period, "failureThreshold": failures,
            "timeoutSeconds": timeout}


def _anti_affinity(component: str) -> dict[str, Any]:
    """Replicas on different nodes where the cluster can, so one node's loss takes one replica."""
    return {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
        "weight": 100, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                           "labelSelector": {"matchLabels": labels(component)}}}]}}


def _pdb(name: str, o: Options, component: str) -> dict[str, Any]:
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": _meta(name, o, component),
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": labels(component)}}}


# -- Kafka (Strimzi) ---------------------------------------------------------------------------------------------

def _config_value(value: str) -> bool | int | str:
    """Kafka's numbers and booleans as YAML ones (as Strimzi's examples write them), the rest as strings."""
    if value in ("true", "false"):
        return value == "true"
    return int(value) if value.lstrip("-").isdigit() else value


def topic_config(topic: Topic, o: Options) -> dict[str, bool | int | str]:
    """The catalogue's settings plus what `schemas.admin.ensure_topics` adds on a cluster of this size."""
    config = {**topic.config, "min.insync.replicas": str(min_insync_replicas(o.replication_factor))}
    return {key: _config_value(value) for key, value in config.items()}


def kafka_topic(topic: Topic, o: Options) -> Doc:
    meta = _meta(topic.name, o, "kafka")
    meta["labels"] = {"strimzi.io/cluster": o.kafka_cluster, **meta["labels"]}
    return (f"{topic.name}: {topic.doc}; keyed by {topic.key_field}.", {
        "apiVersion": STRIMZI_API, "kind": "KafkaTopic", "metadata": meta,
        "spec": {"partitions": topic.partitions, "replicas": o.replication_factor, "config": topic_config(topic, o)}})


def _acl(acl: acls.Acl) -> dict[str, Any]:
    resource: dict[str, Any] = {"type": acl.resource}
    if acl.resource != "cluster":
        resource |= {"name": acl.name, "patternType": acl.pattern}
    return {"type": "allow", "resource": resource, "operations": list(acl.operations)}


def kafka_user(user: acls.ServiceUser, o: Options) -> Doc:
    meta = _meta(user.name, o, "kafka")
    meta["labels"] = {"strimzi.io/cluster": o.kafka_cluster, **meta["labels"]}
    return (f"{user.principal}: {user.why}.", {
        "apiVersion": STRIMZI_API, "kind": "KafkaUser", "metadata": meta,
        "spec": {"authentication": {"type": "scram-sha-512"},
                 "authorization": {"type": "simple", "acls": [_acl(acl) for acl in user.acls]}}})


#: Broker settings of the local cluster that Strimzi lets a Kafka resource set (listeners, TLS, SASL, the
#: authorizer and super users are Strimzi's own: the listener and `authorization` below say them).
BROKER_KEYS = (
    "auto.create.topics.enable", "num.partitions", "default.replication.factor", "min.insync.replicas",
    "unclean.leader.election.enable", "offsets.topic.replication.factor", "offsets.topic.num.partitions",
    "transaction.state.log.replication.factor", "transaction.state.log.min.isr",
    "transaction.state.log.num.partitions", "message.max.bytes",
)


def broker_config(o: Options) -> dict[str, bool | int | str]:
    text = server_properties(BrokerSettings(brokers=o.kafka_brokers), 1, Path("/var/lib/kafka"))
    local = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    return {key: _config_value(local[key]) for key in BROKER_KEYS}


def kafka_cluster(o: Options) -> list[Doc]:
    cluster_label = {"strimzi.io/cluster": o.kafka_cluster}
    pool_meta = _meta(f"{o.kafka_cluster}-nodes", o, "kafka")
    pool_meta["labels"] = {**cluster_label, **pool_meta["labels"]}
    annotations = {"strimzi.io/node-pools": "enabled", "strimzi.io/kraft": "enabled"}  # needed before Strimzi 1.0
    return [
        ("The cluster: SASL_SSL with SCRAM-SHA-512 on 9093 (the services' TETHER_BUS_*), Kafka's simple authorizer "
         "(each KafkaUser's ACLs, nothing else), the local secured cluster's durability settings "
         "(infra/kafka/config.py). Skip this file if your platform already runs a Kafka through Strimzi: give "
         "it such a listener and authorization, and set tether-config's TETHER_BUS_BOOTSTRAP_SERVERS.", {
             "apiVersion": STRIMZI_API, "kind": "Kafka",
             "metadata": _meta(o.kafka_cluster, o, "kafka", annotations=annotations),
             "spec": {
                 "kafka": {
                     "listeners": [{"name": "scram", "port": 9093, "type": "internal", "tls": True,
                                    "authentication": {"type": "scram-sha-512"}}],
                     "authorization": {"type": "simple"},
                     "config": broker_config(o),
                 },
                 "entityOperator": {"topicOperator": {}, "userOperator": {}},
             }}),
        (f"{o.kafka_brokers} KRaft nodes, each broker and controller (as `tether kafka up --brokers 3` runs them).", {
            "apiVersion": STRIMZI_API, "kind": "KafkaNodePool", "metadata": pool_meta,
            "spec": {
                "replicas": o.kafka_brokers, "roles": ["controller", "broker"],
                "storage": {"type": "jbod", "volumes": [{"id": 0, "type": "persistent-claim", "size": "100Gi",
                                                         "deleteClaim": False, "kraftMetadata": "shared"}]},
                "resources": {"requests": {"cpu": "1", "memory": "4Gi"}, "limits": {"memory": "4Gi"}},
            }}),
    ]


# -- configuration -----------------------------------------------------------------------------------------------

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
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(CONFIG, o, "config"), "data": data})


def models_claim(o: Options) -> Doc:
    return (f"The model folder (weights, tokenizer.json, tokenizer_config.json, chat template) at {o.model_dir}: "
            "the gateways' tokenizer, the engine's and the trainer's starting weights. Copy the model into it once "
            "(docs/deployment.md); it needs a storage class that mounts on several nodes.", {
                "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": _meta(MODELS, o, "models"),
                "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "50Gi"}}}})


# -- gateway and its load balancer -------------------------------------------------------------------------------

def gateway(o: Options) -> list[Doc]:
    env: list[dict[str, Any]] = [
        {"name": "TETHER_GATEWAY_GATEWAY_ID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "TETHER_GATEWAY_PUBLIC_URL",
         "value": f"http://$(TETHER_GATEWAY_GATEWAY_ID).{GATEWAY_PEERS}.{o.namespace}.svc.{o.cluster_domain}:{PORT}"},
        _secret_env("TETHER_GATEWAY_SECRET", GATEWAY_KEYS, "secret"),
        _secret_env("TETHER_GATEWAY_ADMIN_KEY", GATEWAY_KEYS, "admin-key"),
        *_bus_env("gateway"),
    ]
    container = _container(
        "gateway", o, ["tether", "gateway", "serve"], env,
        [_mount("kafka-ca", CA_DIR), _mount("models", MODELS_DIR)],
        {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "8Gi"}},
        ports=[{"name": "http", "containerPort": PORT}],
        startupProbe=_http_probe("/health", "http", 2, 150),  # loading the tokenizer, joining the run
        readinessProbe=_http_probe("/health", "http", 2, 2),
        livenessProbe=_http_probe("/health", "http", 10, 3, timeout=5),
    )
    return [
        ("One DNS name per gateway pod (GATEWAY_REPLICAS-N.GATEWAY_PEERS...), which HAProxy's servers name; "
         "not-ready pods are published too, since HAProxy's own checks decide.".replace(
             "GATEWAY_REPLICAS", GATEWAY_REPLICAS).replace("GATEWAY_PEERS", GATEWAY_PEERS), {
             "apiVersion": "v1", "kind": "Service", "metadata": _meta(GATEWAY_PEERS, o, "gateway"),
             "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": labels("gateway"),
                      "ports": [{"name": "http", "port": PORT, "targetPort": "http"}]}}),
        ("Gateways: a StatefulSet, so each replica keeps its name across restarts and rescheduling. Its name is "
         "its gateway id on tether.control (a restarted replica rejoins and drains as itself, and the trainer "
         "never waits for a member that is gone) and its server in HAProxy (the same hash ring on every "
         "HAProxy replica). Any replica serves any rollout (it reads one it does not hold back from the log).", {
             "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": _meta(GATEWAY_REPLICAS, o, "gateway"),
             "spec": {
                 "serviceName": GATEWAY_PEERS, "replicas": o.gateway_replicas, "podManagementPolicy": "Parallel",
                 "selector": {"matchLabels": labels("gateway")},
                 "template": {
                     "metadata": {"labels": labels("gateway")},
                     "spec": {
                         "automountServiceAccountToken": False,
                         "securityContext": _pod_security(),
                         "terminationGracePeriodSeconds": 90,  # calls in flight finish; then GatewayLeft
                         "affinity": _anti_affinity("gateway"),
                         "containers": [container],
                         "volumes": [_ca_volume(o), _models_volume(), STATE_VOLUME],
                     }}}}),
        ("Voluntary disruptions (drains, upgrades) take one gateway at a time.", _pdb(GATEWAY_REPLICAS, o, "gateway")),
    ]


def haproxy_config(o: Options) -> str:
    """infra/loadbalancer.py's configuration, its servers being the gateway pods by DNS name."""
    if o.gateway_slots < o.gateway_replicas:
        raise ValueError("gateway slots must be at least the gateway replicas: HAProxy would never route to the "
                         "others")
    base = loadbalancer.config(port=PORT, replicas=[], host="0.0.0.0").rstrip()
    if base.rfind("\nbackend gateways\n") < base.rfind("\nfrontend "):
        raise ValueError("infra/loadbalancer.py's backend is no longer its last section: servers go into it here")
    servers = "\n".join(f"    server {GATEWAY_REPLICAS}-{i} {o.pod_dns(i)}:{PORT} check resolvers cluster "
                        "init-addr none" for i in range(o.gateway_slots))
    return f"""{base}
    # Every pod the StatefulSet may have, by its stable DNS name: one not running does not resolve and is
    # left out of the hash ring; the ring (server ids) is the same on every HAProxy replica.
{servers}

resolvers cluster
    parse-resolv-conf
    hold valid 5s
    hold nx 5s
    hold obsolete 5s
    timeout resolve 1s
    timeout retry 1s
    resolve_retries 3

frontend lb_health
    bind 0.0.0.0:{LB_HEALTH_PORT}
    monitor-uri /healthz
    monitor fail if {{ nbsrv(gateways) lt 1 }}
"""


def gateway_lb(o: Options) -> list[Doc]:
    cfg = haproxy_config(o)
    digest = hashlib.sha256(cfg.encode()).hexdigest()[:16]
    container = {
        "name": "haproxy", "image": o.haproxy_image,
        "command": ["haproxy", "-W", "-db", "-f", "/usr/local/etc/haproxy/haproxy.cfg"],
        "ports": [{"name": "http", "containerPort": PORT}, {"name": "health", "containerPort": LB_HEALTH_PORT}],
        "readinessProbe": _http_probe("/healthz", "health", 2, 2),  # ready while a gateway is up
        "livenessProbe": {"tcpSocket": {"port": "http"}, "periodSeconds": 10, "failureThreshold": 3},
        "volumeMounts": [_mount("config", "/usr/local/etc/haproxy")],
        "resources": {"requests": {"cpu": "500m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}},
        "securityContext": _container_security(),
    }
    return [
        ("HAProxy's configuration: infra/loadbalancer.py's rules (the rollout from the path or the id inside the "
         "rollout token, consistent hashing, /health checks every 0.5 s, failed connections resent to another "
         "replica).", {
             "apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(GATEWAY_LB, o, "gateway-lb"),
             "data": {"haproxy.cfg": cfg}}),
        ("Rollout affinity: a Service's ClientIP affinity pins a client address, not a rollout (every harness pod "
         "has its own address, and the controller calls for every rollout from one), so HAProxy hashes each "
         "request on its rollout, as `tether up` does locally. Its replicas share the configuration, hence the "
         "hash ring.", {
             "apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(GATEWAY_LB, o, "gateway-lb"),
             "spec": {
                 "replicas": o.lb_replicas, "selector": {"matchLabels": labels("gateway-lb")},
                 "template": {
                     "metadata": {"labels": labels("gateway-lb"),
                                  "annotations": {"tether.dev/haproxy-cfg-sha256": digest}},  # rolls on a change
                     "spec": {
                         "automountServiceAccountToken": False,
                         "securityContext": _pod_security(HAPROXY_USER_ID),
                         "affinity": _anti_affinity("gateway-lb"),
                         "containers": [container],
                         "volumes": [{"name": "config", "configMap": {"name": GATEWAY_LB}}],
                     }}}}),
        ("The gateway's address: harnesses (TETHER_CONTROLLER_HARNESS_GATEWAY_URL) and the controller's admin API "
         "(TETHER_CONTROLLER_GATEWAY_URL) both go through HAProxy.", {
             "apiVersion": "v1", "kind": "Service", "metadata": _meta(GATEWAY, o, "gateway-lb"),
             "spec": {"selector": labels("gateway-lb"),
                      "ports": [{"name": "http", "port": PORT, "targetPort": "http"}]}}),
        ("", _pdb(GATEWAY_LB, o, "gateway-lb")),
    ]


# -- processors, trainer and engine, controller ------------------------------------------------------------------

def processors(o: Options) -> list[Doc]:
    if not 1 <= o.processor_replicas <= CALLS.partitions:
        raise ValueError(f"processor replicas must be 1..{CALLS.partitions} (the partitions of {CALLS.name})")
    env = [*_bus_env("processors"),
           _secret_env("TETHER_PROCESSOR_CLICKHOUSE_DSN", CLICKHOUSE, "dsn", optional=True)]
    container = _container(
        "processors", o, ["tether", "processors", "run"], env, [_mount("kafka-ca", CA_DIR)],
        {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "4Gi"}})
    return [(
        f"Stream processors: Faust workers of one consumer group (TETHER_PROCESSOR_APP_ID) sharing the partitions. "
        f"A partition has one reader in a group, so replicas beyond the {CALLS.partitions} partitions of "
        f"{CALLS.name} (and tether.rollouts) would idle; beyond 4 the grouping stage (tether.samples' 4 partitions) "
        "has idle workers already. Their tables are in memory, restored from changelog topics; a rolling update "
        "adds no pod before one is gone (maxSurge 0).", {
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(PROCESSORS, o, "processors"),
            "spec": {
                "replicas": o.processor_replicas, "selector": {"matchLabels": labels("processors")},
                "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
                "template": {
                    "metadata": {"labels": labels("processors")},
                    "spec": {
                        "automountServiceAccountToken": False,
                        "securityContext": _pod_security(),
                        "affinity": _anti_affinity("processors"),
                        "containers": [container],
                        "volumes": [_ca_volume(o), STATE_VOLUME],
                    }}}})]


def trainer_config(o: Options) -> dict[str, Any]:
    return {"run_id": o.run_id, "model": o.model_dir, "checkpoint_dir": CHECKPOINTS,
            "engine_url": f"http://127.0.0.1:{ENGINE_PORT}", "batch_groups": 8, "device": "cuda"}


def trainer(o: Options) -> list[Doc]:
    engine = _container(
        "engine", o, ["tether", "engine", "serve"], [],
        [_mount("models", MODELS_DIR), _mount("checkpoints", CHECKPOINTS)],
        {"requests": {"cpu": "4", "memory": "32Gi"}, "limits": {"memory": "32Gi", "nvidia.com/gpu": 1}},
        ports=[{"name": "http", "containerPort": ENGINE_PORT}],
        startupProbe=_http_probe("/health", "http", 5, 120),  # loading the model
        readinessProbe=_http_probe("/health", "http", 5, 2),
        livenessProbe=_http_probe("/health", "http", 10, 6, timeout=5),
    )
    learner = _container(
        "trainer", o, ["tether", "trainer", "run", f"{TRAINER_DIR}/trainer.yaml"], _bus_env("trainer"),
        [_mount("kafka-ca", CA_DIR), _mount("models", MODELS_DIR), _mount("config", TRAINER_DIR),
         _mount("checkpoints", CHECKPOINTS, read_only=False)],
        {"requests": {"cpu": "4", "memory": "32Gi"}, "limits": {"memory": "64Gi", "nvidia.com/gpu": 1}})
    return [
        ("The trainer's file (trainer/config.py): one run, collocated with the engine in its pod.", {
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(TRAINER, o, "trainer"),
            "data": {"trainer.yaml": dump(trainer_config(o))}}),
        ("Trainer and engine, collocated: the engine serves the run's completions and loads each version the "
         "trainer commits, from the checkpoint volume they share. A StatefulSet of one: never two trainers of a "
         "run (a Deployment may run two during a rollout), and the same checkpoint volume after a restart, from "
         "whose LATEST the trainer resumes. With vLLM servers instead, use backend: verl (docs/deployment.md).", {
             "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": _meta(TRAINER, o, "trainer"),
             "spec": {
                 "serviceName": ENGINE, "replicas": 1, "selector": {"matchLabels": labels("trainer")},
                 "template": {
                     "metadata": {"labels": labels("trainer")},
                     "spec": {
                         "automountServiceAccountToken": False,
                         "securityContext": _pod_security(),
                         "containers": [engine, learner],
                         "volumes": [_ca_volume(o), _models_volume(),
                                     {"name": "config", "configMap": {"name": TRAINER}}, STATE_VOLUME],
                     }},
                 "volumeClaimTemplates": [{
                     "metadata": {"name": "checkpoints", "labels": labels("trainer")},
                     "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "200Gi"}}}}],
             }}),
        ("The engine's address (TETHER_GATEWAY_ENGINES).", {
            "apiVersion": "v1", "kind": "Service", "metadata": _meta(ENGINE, o, "trainer"),
            "spec": {"selector": labels("trainer"),
                     "ports": [{"name": "http", "port": ENGINE_PORT, "targetPort": "http"}]}}),
    ]


#: What the Kubernetes runner (controller/runners/kubernetes.py) calls, and nothing more.
CONTROLLER_RULES: list[dict[str, Any]] = [
    {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create", "get", "list", "watch", "delete"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
]


def controller(o: Options) -> list[Doc]:
    return [
        ("The controller's identity in the cluster (the Kubernetes runner uses the in-cluster config).", {
            "apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(CONTROLLER, o, "controller")}),
        ("Rollout Jobs in this namespace: create, watch, read, delete them; read their pods and logs.", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": _meta(CONTROLLER, o, "controller"), "rules": CONTROLLER_RULES}),
        ("", {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
              "metadata": _meta(CONTROLLER, o, "controller"),
              "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": CONTROLLER},
              "subjects": [{"kind": "ServiceAccount", "name": CONTROLLER, "namespace": o.namespace}]}),
    ]


EXAMPLE_TASKS = ({"id": "add-2-3", "question": "What is 2 + 3?", "answer": "5"},
                 {"id": "capital-fr", "question": "What is the capital of France?", "answer": "Paris"})


def run_file(o: Options) -> dict[str, Any]:
    return {"run_id": o.run_id, "dataset": "tasks.jsonl", "group_size": 4, "runner": "kubernetes",
            "harness": {"job_template": "job-template.yaml"}, "concurrency": 16, "max_groups_in_flight": 8,
            "timeout_s": 600, "reward": {"source": "harness"},
            "kubernetes": {"namespace": o.namespace, "creations_per_s": 5, "ttl_s": 600},
            "log_dir": f"{STATE_DIR}/runs"}


def controller_run(o: Options) -> list[Doc]:
    files = {"run.yaml": dump(run_file(o)),
             "tasks.jsonl": "".join(json.dumps(task) + "\n" for task in EXAMPLE_TASKS),
             "job-template.yaml": JOB_TEMPLATE.read_text()}
    env = [_secret_env("TETHER_CONTROLLER_GATEWAY_SECRET", GATEWAY_KEYS, "secret"),
           _secret_env("TETHER_CONTROLLER_GATEWAY_ADMIN_KEY", GATEWAY_KEYS, "admin-key"),
           *_bus_env("controller")]
    container = _container(
        "controller", o, ["tether", "controller", "run", f"{RUN_DIR}/run.yaml"], env,
        [_mount("kafka-ca", CA_DIR), _mount("run", RUN_DIR)],
        {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "1Gi"}})
    return [
        ("One run's input: its run file, its tasks and the harness's Job template (a copy of "
         "infra/k8s/job-template.yaml). An example: replace it with `kubectl create configmap` from your own "
         "files (docs/deployment.md).", {
             "apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(RUN, o, "controller"), "data": files}),
        ("The run's controller: it launches a Job per rollout and exits when every task group is done. A crash "
         "restarts it in its pod (restartPolicy OnFailure), and a restarted controller re-attaches to the Jobs "
         "still running (it folds the run's history from tether.rollouts).", {
             "apiVersion": "batch/v1", "kind": "Job", "metadata": _meta(f"{CONTROLLER}-{o.run_id}", o, "controller"),
             "spec": {
                 "backoffLimit": 10,
                 "template": {
                     "metadata": {"labels": labels("controller")},
                     "spec": {
                         "serviceAccountName": CONTROLLER,
                         "restartPolicy": "OnFailure",
                         "securityContext": _pod_security(),
                         "containers": [container],
                         "volumes": [_ca_volume(o), {"name": "run", "configMap": {"name": RUN}}, STATE_VOLUME],
                     }}}}),
    ]


def network_policy(o: Options) -> Doc:
    reachable = {"matchExpressions": [{"key": "app.kubernetes.io/name", "operator": "In",
                                       "values": [labels("gateway-lb")["app.kubernetes.io/name"],
                                                  labels("gateway")["app.kubernetes.io/name"]]}]}
    return ("Rollout pods may reach the gateway (HAProxy, or a gateway pod) and DNS, nothing else: a harness "
            "cannot reach Kafka, the trainer, the engine, other rollouts or the internet. Its pods are the ones "
            "job-template.yaml labels.", {
                "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                "metadata": _meta("tether-rollouts-reach-only-the-gateway", o, "rollout"),
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


def namespace(o: Options) -> Doc:
    return ("Tether's namespace: its services, the rollout Jobs, the Kafka cluster and its users. Pods must meet "
            "the baseline Pod Security Standard (a harness image may run as it was built); Tether's own meet "
            "restricted.", {
                "apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": o.namespace, "labels": {
                    "app.kubernetes.io/part-of": "tether", "pod-security.kubernetes.io/enforce": "baseline",
                    "pod-security.kubernetes.io/warn": "restricted"}}})


# -- the files ---------------------------------------------------------------------------------------------------

BASE = ("namespace.yaml", "config.yaml", "gateway.yaml", "gateway-lb.yaml", "processors.yaml", "trainer.yaml",
        "controller.yaml", "network-policy.yaml")


def _kustomization(resources: Sequence[str], note: str, o: Options, images: bool) -> str:
    doc: dict[str, Any] = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                           "resources": list(resources)}
    if images:
        name, _, tag = o.image.rpartition(":")
        doc["images"] = [{"name": name, "newName": name, "newTag": tag}]  # point these at your image
    return _comment(note + "\n\nGenerated by infra/k8s/render.py (`tether k8s render`): edit that, not this file.") \
        + dump(doc)


def render(o: Options = DEFAULT) -> dict[str, str]:
    """Every generated file, by its path under infra/k8s/."""
    return {
        "namespace.yaml": _file("The namespace.", [namespace(o)]),
        "config.yaml": _file("Configuration and the model volume.", [config_map(o), models_claim(o)]),
        "gateway.yaml": _file("The gateway replicas.", gateway(o)),
        "gateway-lb.yaml": _file("HAProxy in front of the gateway replicas: rollout affinity.", gateway_lb(o)),
        "processors.yaml": _file("The stream processors.", processors(o)),
        "trainer.yaml": _file("The trainer and the engine.", trainer(o)),
        "controller.yaml": _file("What a run's controller may do in the cluster (its Job: run/controller.yaml).",
                                 controller(o)),
        "network-policy.yaml": _file("Rollouts reach only the gateway.", [network_policy(o)]),
        "kustomization.yaml": _kustomization(
            BASE, "Tether's services: `kubectl apply -k infra/k8s` (after strimzi/, see docs/deployment.md).", o,
            images=True),
        "run/input.yaml": _file("An example run's input (`kubectl apply -f`, or make your own: docs/deployment.md).",
                                controller_run(o)[:1]),
        "run/controller.yaml": _file("One run's controller (`kubectl apply -f`, once per run).", controller_run(o)[1:]),
        "strimzi/kafka.yaml": _file("A Kafka cluster through Strimzi, if you have none (needs Strimzi 0.49+, "
                                    "for the kafka.strimzi.io/v1 API).", kafka_cluster(o)),
        "strimzi/topics.yaml": _file("The topic catalogue (schemas/topics.py) as Strimzi KafkaTopics.",
                                     [kafka_topic(t, o) for t in CATALOGUE]),
        "strimzi/users.yaml": _file(
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


# -- Strimzi's CRD schemas ---------------------------------------------------------------------------------------

def _java() -> str:
    """A Java of 21 or newer (Strimzi's CRD generator is built for it)."""
    candidates = [os.environ.get("JAVA_HOME", ""), "/usr/lib/jvm/temurin-25-jdk-amd64"]
    for home in candidates:
        if home and (Path(home) / "bin" / "java").is_file():
            return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise RuntimeError("no Java: set JAVA_HOME to a JDK 21+")
    return found


def _strip(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: _strip(v) for k, v in schema.items() if k != "description"}
    if isinstance(schema, list):
        return [_strip(v) for v in schema]
    return schema


def strimzi_schemas(out: Path = STRIMZI_SCHEMAS) -> list[Path]:
    """Fetch Strimzi's api and crd-generator jars (strimzi/pom.xml, Maven Central), generate the CRDs of the
    kinds rendered here as Strimzi's build does, and keep each one's openAPIV3Schema (descriptions dropped)."""
    pom = STRIMZI / "pom.xml"
    version = next(line.split(">")[1].split("<")[0] for line in pom.read_text().splitlines()
                   if "<strimzi.version>" in line)
    with tempfile.TemporaryDirectory() as tmp:
        libs, crds = Path(tmp) / "libs", Path(tmp) / "crds"
        crds.mkdir()
        subprocess.run(["mvn", "-q", "-f", str(pom), "dependency:copy-dependencies",
                        f"-DoutputDirectory={libs}"], check=True)
        subprocess.run([_java(), "-cp", f"{libs}/*", "io.strimzi.crdgenerator.CrdGenerator",
                        "--target-kube", "1.16+", "--crd-api-version", "v1", "--api-versions", "v1",
                        "--storage-version", "v1", "--yaml",
                        *(f"{cls}={crds / kind}.yaml" for kind, cls in STRIMZI_KINDS.items())], check=True)
        written = []
        out.mkdir(parents=True, exist_ok=True)
        for kind in STRIMZI_KINDS:
            crd = yaml.load((crds / f"{kind}.yaml").read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
            (served,) = [v for v in crd["spec"]["versions"] if v["name"] == STRIMZI_API.split("/")[1]]
            schema = {"$comment": f"{crd['spec']['group']}/{served['name']} {kind}: openAPIV3Schema of the CRD "
                                  f"generated by Strimzi {version}'s CrdGenerator (infra/k8s/render.py "
                                  "--strimzi-schemas); descriptions dropped",
                      **_strip(served["schema"]["openAPIV3Schema"])}
            path = out / f"{kind}.json"
            path.write_text(json.dumps(schema, indent=1, sort_keys=True) + "\n")
            written.append(path)
    return written


# -- command line ------------------------------------------------------------------------------------------------

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
