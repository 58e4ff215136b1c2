"""How the controller process reaches the gateway and Kafka; read once from TETHER_CONTROLLER_* (and TETHER_BUS_*)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from schemas.rollout_token import DEVELOPMENT_ADMIN_KEY, DEVELOPMENT_SECRET, SECRET_PATTERN
from schemas.settings import BusSettings


class ControllerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TETHER_CONTROLLER_", frozen=True)

    gateway_url: str = Field("http://127.0.0.1:8000", description="Admin API (register, seal).")
    harness_gateway_url: str | None = Field(None, description="How harnesses reach the gateway; default gateway_url.")
    gateway_admin_key: str = Field(DEVELOPMENT_ADMIN_KEY, min_length=8)
    gateway_secret: str = Field(DEVELOPMENT_SECRET, min_length=8, pattern=SECRET_PATTERN,
                                description="Mints rollout tokens.")
    bus: BusSettings = Field(default_factory=BusSettings)

    @property
    def harness_url(self) -> str:
        return (self.harness_gateway_url or self.gateway_url).rstrip("/")
