"""Where the local Kafka lives and listens, how many brokers it has and whether it is secured; read once from
TETHER_KAFKA_* variables."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

NODE_PORT_STEP = 10  # node k listens on port + 10*(k-1), controller_port + 10*(k-1), internal_port + 10*(k-1)
MAX_REPLICATION = 3  # more copies buy nothing on one machine


class BrokerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TETHER_KAFKA_", frozen=True)

    version: str = Field("4.1.1", description="Apache Kafka version fetched from Maven Central.")
    cache_dir: Path = Field(Path.home() / ".cache" / "tether" / "kafka", description="Jars, outside git.")
    state_dir: Path = Field(Path(".tether") / "kafka", description="Config, data, logs, PID files, certificates "
                            "and passwords; wipeable.")
    brokers: int = Field(1, ge=1, le=9, description="KRaft nodes, each broker and controller; 3 gives replication "
                         "factor 3 with min.insync.replicas=2.")
    security: Literal["plaintext", "sasl_ssl"] = Field(
        "plaintext", description="sasl_ssl: clients on TLS (the cluster's own CA) with a SCRAM-SHA-512 user per "
        "service and ACLs; brokers and controllers on mutual TLS.")
    host: str = "127.0.0.1"
    port: int = Field(9092, ge=1, le=65535, description="Client port of node 1; node k adds 10*(k-1).")
    controller_port: int = Field(9093, ge=1, le=65535, description="KRaft quorum port of node 1.")
    internal_port: int = Field(9094, ge=1, le=65535, description="Inter-broker port of node 1 (sasl_ssl only).")
    heap: str = Field("512m", pattern=r"^\d+[mMgG]$", description="JVM -Xmx of each node; the machine is shared.")
    start_timeout_s: float = Field(120.0, gt=0)
    stop_timeout_s: float = Field(30.0, gt=0)

    @property
    def secured(self) -> bool:
        return self.security == "sasl_ssl"

    @property
    def node_ids(self) -> range:
        return range(1, self.brokers + 1)

    def node_port(self, node: int, base: int) -> int:
        return base + NODE_PORT_STEP * (node - 1)

    @property
    def replication_factor(self) -> int:
        return min(self.brokers, MAX_REPLICATION)

    @property
    def bootstrap(self) -> str:
        return ",".join(f"{self.host}:{self.node_port(node, self.port)}" for node in self.node_ids)
