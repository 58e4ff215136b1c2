"""What every manifest agrees on: the folders, the names, ports and paths that Services, the NetworkPolicy, the
HAProxy servers, the RoleBinding and the run file share, and the `Options` a platform team may render with. Kept
apart so that every resource module reads the same constants, and nothing here knows a resource's shape."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

# what the pods share with the images, read from their table
from infra.images.roles import BY_NAME, GATEWAY_PORT
from infra.images.roles import ENGINE_PORT as ENGINE_PORT
from infra.images.roles import RUN_DIR as RUN_DIR
from infra.images.roles import STATE_DIR as STATE_DIR
from infra.images.roles import TRAINER_DIR as TRAINER_DIR
from infra.images.roles import USER_ID as USER_ID

HERE = Path(__file__).resolve().parent
JOB_TEMPLATE = HERE / "job-template.yaml"
STRIMZI = HERE / "strimzi"
STRIMZI_SCHEMAS = STRIMZI / "schemas"
STRIMZI_API = "kafka.strimzi.io/v1"

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
PORT = GATEWAY_PORT  # the gateway's (and HAProxy's) HTTP port
LB_HEALTH_PORT = 8404
CA_DIR = "/etc/tether/kafka-ca"
MODELS_DIR = "/models"
CHECKPOINTS = f"{STATE_DIR}/checkpoints"
HAPROXY_USER_ID = 99  # the official haproxy image's `haproxy` user


@dataclass(frozen=True)
class Options:
    """What a platform team may change by rendering again; the committed files use the defaults."""

    namespace: str = "tether"
    run_id: str = "my-run"
    registry: str = "ghcr.io/example"  # where the images are (infra/images: tether-gateway, tether-processors...)
    tag: str = "0.1.0"
    haproxy_image: str = "docker.io/library/haproxy:3.2"
    kafka_cluster: str = "tether"
    kafka_brokers: int = 3
    gateway_replicas: int = 2
    gateway_slots: int = 8  # HAProxy servers listed: the most gateway replicas without rendering again
    lb_replicas: int = 2
    processor_replicas: int = 2
    model_dir: str = f"{MODELS_DIR}/model"
    cluster_domain: str = "cluster.local"

    def image(self, role: str) -> str:
        """The image of `role` (infra/images/roles.py), in the registry, at the tag."""
        return f"{self.registry}/{BY_NAME[role].image}:{self.tag}"

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
