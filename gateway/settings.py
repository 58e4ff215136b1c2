"""How one gateway process runs; read once from TETHER_GATEWAY_* variables (and TETHER_BUS_* for Kafka).

A YAML file named by TETHER_GATEWAY_CONFIG supplies the same fields (lowest
priority: the environment wins over it, flags over both).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from pydantic import Field
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from schemas.settings import BusSettings


class GatewaySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TETHER_GATEWAY_", frozen=True)

    run_id: str = Field("local", description="The run this gateway serves (its control events are keyed by it).")
    gateway_id: str = Field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    public_url: str | None = Field(None, description="How harnesses reach it; defaults to http://host:port.")
    secret: str = Field("tether-dev-secret", min_length=8, description="HMAC key of rollout tokens.")
    admin_key: str = Field("tether-dev-admin", min_length=8, description="Key for /admin endpoints.")
    path_binding_requires_token: bool = Field(
        True, description="/rollouts/{id}/v1/... also needs that rollout's token as the API key; turn off only "
        "for harnesses whose key cannot be set, on a network where rollouts trust each other."
    )
    engines: list[str] = Field(default_factory=lambda: ["http://127.0.0.1:8100"])
    tokenizer: Path = Field(Path(".tether/models/tiny"),
                            description="Model directory: tokenizer.json, tokenizer_config.json, chat template.")
    model_name: str | None = Field(None, description="Model name to ask the engines for; default: what they serve.")
    tool_parser: str = "hermes"
    max_hold_s: float = Field(60.0, gt=0, description="Longest a call waits for a weight update before a 503.")
    max_body_bytes: int = Field(16 * 1024 * 1024, ge=1024)
    engine_retries: int = Field(3, ge=0)
    engine_timeout_s: float = Field(600.0, gt=0)
    bus: BusSettings = Field(default_factory=BusSettings)

    @property
    def url(self) -> str:
        return self.public_url or f"http://{self.host}:{self.port}"

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        config = os.environ.get("TETHER_GATEWAY_CONFIG")
        files = (YamlConfigSettingsSource(settings_cls, yaml_file=config),) if config else ()
        return (init_settings, env_settings, *files)
