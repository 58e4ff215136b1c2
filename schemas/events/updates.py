"""The weight-update handshake between the trainer and the gateways, and the gateways' membership."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from schemas.events._checks import require, require_aware, require_ids, utcnow


@dataclass(frozen=True, slots=True, kw_only=True)
class UpdateRequested:
    run_id: str
    version: int
    n_task_groups: int
    requested_at: datetime = field(default_factory=utcnow)

    def __post_init__(self) -> None:
        require_ids(self, "run_id")
        require(self.version >= 1, self, "version must be >= 1")
        require_aware(self, "requested_at")


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewayDrained:
    run_id: str
    version: int
    gateway_id: str
    held_calls: int = 0
    drained_at: datetime = field(default_factory=utcnow)

    def __post_init__(self) -> None:
        require_ids(self, "run_id", "gateway_id")
        require_aware(self, "drained_at")


@dataclass(frozen=True, slots=True, kw_only=True)
class WeightVersionPublished:
    run_id: str
    version: int
    checkpoint_path: str | None = None
    final: bool = False  # the trainer's last update of the run
    adapter: bool = False  # a low-rank adapter on the run's base (v9), not whole weights
    published_at: datetime = field(default_factory=utcnow)

    def __post_init__(self) -> None:
        require_ids(self, "run_id")
        require(self.version >= 0, self, "version must be >= 0")
        require_aware(self, "published_at")


@dataclass(frozen=True, slots=True, kw_only=True)
class UpdateAborted:
    run_id: str
    version: int
    reason: str
    aborted_at: datetime = field(default_factory=utcnow)

    def __post_init__(self) -> None:
        require_ids(self, "run_id")
        require_aware(self, "aborted_at")


HEARTBEAT_S = 10.0  # a gateway repeats its GatewayJoined this often, by default
LEASE_S = 30.0  # and a gateway not heard from for this long is taken for dead, by default


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewayJoined:
    run_id: str
    gateway_id: str
    url: str
    joined_at: datetime = field(default_factory=utcnow)

    def __post_init__(self) -> None:
        require_ids(self, "run_id", "gateway_id")
        require_aware(self, "joined_at")


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewayLeft:
    run_id: str
    gateway_id: str
    reason: str
    left_at: datetime = field(default_factory=utcnow)

    def __post_init__(self) -> None:
        require_ids(self, "run_id", "gateway_id")
        require_aware(self, "left_at")
