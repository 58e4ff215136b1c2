"""The broker's server.properties: one node, both KRaft roles, on loopback, sized for a small shared machine."""

from __future__ import annotations

from pathlib import Path

from infra.kafka.settings import BrokerSettings


def server_properties(settings: BrokerSettings, data_dir: Path) -> str:
    host, port, cport = settings.host, settings.port, settings.controller_port
    return "\n".join([
        "process.roles=broker,controller",
        "node.id=1",
        f"controller.quorum.voters=1@{host}:{cport}",
        f"listeners=PLAINTEXT://{host}:{port},CONTROLLER://{host}:{cport}",
        f"advertised.listeners=PLAINTEXT://{host}:{port}",
        "controller.listener.names=CONTROLLER",
        "inter.broker.listener.name=PLAINTEXT",
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        f"log.dirs={data_dir.resolve()}",
        # Topics come from the catalogue (schemas.admin), never from a typo in a producer.
        "auto.create.topics.enable=false",
        "num.partitions=1",
        "default.replication.factor=1",
        "min.insync.replicas=1",
        "offsets.topic.replication.factor=1",
        "offsets.topic.num.partitions=8",
        "transaction.state.log.replication.factor=1",
        "transaction.state.log.min.isr=1",
        "transaction.state.log.num.partitions=8",
        "share.coordinator.state.topic.replication.factor=1",
        "share.coordinator.state.topic.min.isr=1",
        "group.initial.rebalance.delay.ms=0",
        f"message.max.bytes={64 * 1024 * 1024}",  # topics set their own, smaller limits
        "num.network.threads=2",
        "num.io.threads=4",
        "background.threads=2",
        "",
    ])
