"""Each node's server.properties: KRaft nodes that are broker and controller at once, on loopback, sized for a
small shared machine.

Every node is in the controller quorum (combined mode): three JVMs instead of six on a two-core machine, and
still a quorum that survives one node down. Plaintext: clients and brokers share the PLAINTEXT listener.
Secured (sasl_ssl): three listeners per node, so that no listener serves two kinds of peer:

    CLIENT      SASL_SSL, SCRAM-SHA-512: services, each as its own user, authorized by the ACL table
    INTERNAL    SSL with client certificates: broker to broker replication
    CONTROLLER  SSL with client certificates: the KRaft quorum (SCRAM users live in the metadata it serves,
                so the quorum itself cannot log in with them)

Node certificates map to User:kafka-node-K, super users like `admin`; nobody else gets anything without an ACL.
"""

from __future__ import annotations

from pathlib import Path

from infra.kafka import tls
from infra.kafka.acls import ADMIN
from infra.kafka.settings import BrokerSettings
from schemas.settings import min_insync_replicas

AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
SCRAM = "SCRAM-SHA-512"


def server_properties(settings: BrokerSettings, node: int, data_dir: Path,
                      certs: tls.Certificates | None = None) -> str:
    """The properties of node `node` (1-based); `certs` are required for a secured cluster."""
    host, port = settings.host, settings.node_port(node, settings.port)
    voters = ",".join(f"{n}@{host}:{settings.node_port(n, settings.controller_port)}" for n in settings.node_ids)
    controller = f"CONTROLLER://{host}:{settings.node_port(node, settings.controller_port)}"
    lines = [
        "process.roles=broker,controller",
        f"node.id={node}",
        f"controller.quorum.voters={voters}",
        "controller.listener.names=CONTROLLER",
        *(_secured(settings, node, certs) if settings.secured else [
            f"listeners=PLAINTEXT://{host}:{port},{controller}",
            f"advertised.listeners=PLAINTEXT://{host}:{port}",
            "inter.broker.listener.name=PLAINTEXT",
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        ]),
        f"log.dirs={data_dir.resolve()}",
        *_replication(settings.replication_factor),
        # Topics come from the catalogue (schemas.admin), never from a typo in a producer.
        "auto.create.topics.enable=false",
        "num.partitions=1",
        "offsets.topic.num.partitions=8",
        "transaction.state.log.num.partitions=8",
        "group.initial.rebalance.delay.ms=0",
        f"message.max.bytes={64 * 1024 * 1024}",  # topics set their own, smaller limits
        "num.network.threads=2",
        "num.io.threads=4",
        "background.threads=2",
        "",
    ]
    return "\n".join(lines)


def _replication(factor: int) -> list[str]:
    """Every topic, the brokers' own included, on `factor` nodes; acks=all needs min.insync of them; a replica
    that fell behind never becomes leader (that would drop acknowledged records)."""
    isr = min_insync_replicas(factor)
    return [
        f"default.replication.factor={factor}",
        f"min.insync.replicas={isr}",
        "unclean.leader.election.enable=false",
        f"offsets.topic.replication.factor={factor}",
        f"transaction.state.log.replication.factor={factor}",
        f"transaction.state.log.min.isr={isr}",
        f"share.coordinator.state.topic.replication.factor={factor}",
        f"share.coordinator.state.topic.min.isr={isr}",
    ]


def _secured(settings: BrokerSettings, node: int, certs: tls.Certificates | None) -> list[str]:
    if certs is None:
        raise ValueError("a secured cluster's properties need its certificates")
    host = settings.host
    client = settings.node_port(node, settings.port)
    internal = settings.node_port(node, settings.internal_port)
    controller = settings.node_port(node, settings.controller_port)
    nodes = ";".join(f"User:{tls.node_name(n)}" for n in settings.node_ids)
    return [
        f"listeners=CLIENT://{host}:{client},INTERNAL://{host}:{internal},CONTROLLER://{host}:{controller}",
        f"advertised.listeners=CLIENT://{host}:{client},INTERNAL://{host}:{internal}",
        "inter.broker.listener.name=INTERNAL",
        "listener.security.protocol.map=CLIENT:SASL_SSL,INTERNAL:SSL,CONTROLLER:SSL",
        # TLS: the node's own key and certificate, trusting only the cluster's CA.
        "ssl.keystore.type=PEM",
        f"ssl.keystore.location={certs.node_pem(node).resolve()}",
        "ssl.truststore.type=PEM",
        f"ssl.truststore.location={certs.ca_cert.resolve()}",
        "ssl.endpoint.identification.algorithm=https",
        "listener.name.internal.ssl.client.auth=required",
        "listener.name.controller.ssl.client.auth=required",
        "ssl.principal.mapping.rules=RULE:^CN=([^,]+).*$/$1/,DEFAULT",
        # Clients: SCRAM-SHA-512 users, created at format time (kafka-storage format --add-scram).
        f"sasl.enabled.mechanisms={SCRAM}",
        f"listener.name.client.sasl.enabled.mechanisms={SCRAM}",
        f"listener.name.client.{SCRAM.lower()}.sasl.jaas.config="
        "org.apache.kafka.common.security.scram.ScramLoginModule required;",
        # Authorization: deny unless an ACL allows (infra/kafka/acls.py), super users aside.
        f"authorizer.class.name={AUTHORIZER}",
        "allow.everyone.if.no.acl.found=false",
        f"super.users=User:{ADMIN};{nodes}",
    ]
