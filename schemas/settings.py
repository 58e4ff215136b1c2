"""How a process reaches the bus; read once from TETHER_BUS_* variables."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from schemas.topics import DEADLETTER


class BusSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TETHER_BUS_", frozen=True)

    bootstrap_servers: str = Field("127.0.0.1:9092", description="Kafka bootstrap servers, comma-separated.")
    client_id: str = "tether"
    replication_factor: int = Field(1, ge=1, description="For topics this process creates.")
    request_timeout_ms: int = Field(30_000, ge=1_000)
    delivery_timeout_s: float = Field(120.0, gt=0, description="How long a publish may wait for its acknowledgement.")
    linger_ms: int = Field(0, ge=0, description="0: send at once (calls wait for their ack); batches still form.")
    compression_type: str | None = Field(None, description="gzip, snappy, lz4 or zstd; the codec must be installed.")
    max_request_bytes: int = Field(
        DEADLETTER.max_bytes + 64 * 1024, ge=1024, description="Client-side cap; each topic has its own limit."
    )
    max_partition_fetch_bytes: int = Field(
        4 * 1024 * 1024, ge=1024, description="Per partition and fetch; a larger record still comes whole."
    )
