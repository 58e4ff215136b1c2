"""Kafka through Strimzi: a KafkaTopic per topic of the catalogue (schemas/topics.py) with the replication a
cluster of this size gets from `schemas.admin`, a KafkaUser per service of the ACL table (infra/kafka/acls.py) with
exactly its ACLs, and an example Kafka cluster whose broker settings are the local secured cluster's
(infra/kafka/config.py). Kept apart: these follow Kafka's tables and Strimzi's API, not the services'."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from infra.k8s.options import STRIMZI_API, Doc, Options
from infra.k8s.pieces import labels, meta
from infra.kafka import acls
from infra.kafka.config import server_properties
from infra.kafka.settings import BrokerSettings
from schemas.settings import min_insync_replicas
from schemas.topics import Topic


def _config_value(value: str) -> bool | int | str:
    """Kafka's numbers and booleans as YAML ones (as Strimzi's examples write them), the rest as strings."""
    if value in ("true", "false"):
        return value == "true"
    return int(value) if value.lstrip("-").isdigit() else value


def topic_config(topic: Topic, o: Options) -> dict[str, bool | int | str]:
    """The catalogue's settings plus what `schemas.admin.ensure_topics` adds on a cluster of this size."""
    config = {**topic.config, "min.insync.replicas": str(min_insync_replicas(o.replication_factor))}
    return {key: _config_value(value) for key, value in config.items()}


def _cluster_meta(name: str, o: Options) -> dict[str, Any]:
    """A resource of the cluster's operators: its label names the Kafka resource they serve."""
    return {**meta(name, o, "kafka"), "labels": {"strimzi.io/cluster": o.kafka_cluster, **labels("kafka")}}


def kafka_topic(topic: Topic, o: Options) -> Doc:
    return (f"{topic.name}: {topic.doc}; keyed by {topic.key_field}.", {
        "apiVersion": STRIMZI_API, "kind": "KafkaTopic", "metadata": _cluster_meta(topic.name, o),
        "spec": {"partitions": topic.partitions, "replicas": o.replication_factor, "config": topic_config(topic, o)}})


def _acl(acl: acls.Acl) -> dict[str, Any]:
    resource: dict[str, Any] = {"type": acl.resource}
    if acl.resource != "cluster":
        resource |= {"name": acl.name, "patternType": acl.pattern}
    return {"type": "allow", "resource": resource, "operations": list(acl.operations)}


def kafka_user(user: acls.ServiceUser, o: Options) -> Doc:
    return (f"{user.principal}: {user.why}.", {
        "apiVersion": STRIMZI_API, "kind": "KafkaUser", "metadata": _cluster_meta(user.name, o),
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
    annotations = {"strimzi.io/node-pools": "enabled", "strimzi.io/kraft": "enabled"}  # needed before Strimzi 1.0
    return [
        ("The cluster: SASL_SSL with SCRAM-SHA-512 on 9093 (the services' TETHER_BUS_*), Kafka's simple authorizer "
         "(each KafkaUser's ACLs, nothing else), the local secured cluster's durability settings "
         "(infra/kafka/config.py). Skip this file if your platform already runs a Kafka through Strimzi: give "
         "it such a listener and authorization, and set tether-config's TETHER_BUS_BOOTSTRAP_SERVERS.", {
             "apiVersion": STRIMZI_API, "kind": "Kafka",
             "metadata": meta(o.kafka_cluster, o, "kafka", annotations=annotations),
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
            "apiVersion": STRIMZI_API, "kind": "KafkaNodePool",
            "metadata": _cluster_meta(f"{o.kafka_cluster}-nodes", o),
            "spec": {
                "replicas": o.kafka_brokers, "roles": ["controller", "broker"],
                "storage": {"type": "jbod", "volumes": [{"id": 0, "type": "persistent-claim", "size": "100Gi",
                                                         "deleteClaim": False, "kraftMetadata": "shared"}]},
                "resources": {"requests": {"cpu": "1", "memory": "4Gi"}, "limits": {"memory": "4Gi"}},
            }}),
    ]
