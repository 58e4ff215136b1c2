"""Where the local broker lives and listens; read once from TETHER_KAFKA_* variables."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class BrokerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TETHER_KAFKA_", frozen=True)

    version: str = Field("4.1.1", description="Apache Kafka version fetched from Maven Central.")
    cache_dir: Path = Field(Path.home() / ".cache" / "tether" / "kafka", description="Jars, outside git.")
    state_dir: Path = Field(Path(".tether") / "kafka", description="Config, data, log and PID file; wipeable.")
    host: str = "127.0.0.1"
    port: int = Field(9092, ge=1, le=65535)
    controller_port: int = Field(9093, ge=1, le=65535)
    heap: str = Field("512m", pattern=r"^\d+[mMgG]$", description="JVM -Xmx; the machine is shared.")
    start_timeout_s: float = Field(120.0, gt=0)
    stop_timeout_s: float = Field(30.0, gt=0)

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"
