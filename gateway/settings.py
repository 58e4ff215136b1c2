"""How one gateway process runs; read once from TETHER_GATEWAY_* variables (and TETHER_BUS_* for Kafka).

A YAML file named by TETHER_GATEWAY_CONFIG supplies the same fields (lowest
priority: the environment wins over it, flags over both).
"""

from __future__ import annotations

import ipaddress
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

from gateway.adapters import EngineKind
from schemas.events.updates import HEARTBEAT_S, LEASE_S
from schemas.rollout_token import DEVELOPMENT_ADMIN_KEY, DEVELOPMENT_SECRET, SECRET_PATTERN
from schemas.settings import BusSettings


class DevelopmentKeysExposed(ValueError):
    """The gateway was asked to listen beyond this machine with a built-in development key."""


def is_loopback(host: str) -> bool:
    """Whether only this machine can connect: localhost, 127.0.0.0/8, ::1 (and ::ffff:127.x.y.z)."""
    if host.lower() == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False  # a host name other than localhost may resolve to any interface
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


class GatewaySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TETHER_GATEWAY_", frozen=True)

    run_id: str = Field("local", description="The run this gateway serves (its control events are keyed by it).")
    gateway_id: str = Field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    public_url: str | None = Field(None, description="How harnesses reach it; defaults to http://host:port.")
    secret: str = Field(DEVELOPMENT_SECRET, min_length=8, pattern=SECRET_PATTERN,
                        description="HMAC key of rollout tokens.")
    admin_key: str = Field(DEVELOPMENT_ADMIN_KEY, min_length=8, description="Key for /admin endpoints.")
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
    heartbeat_s: float = Field(HEARTBEAT_S, gt=0, description="How often GatewayJoined is repeated on "
                               "tether.control: the lease by which the trainer knows this gateway is alive.")
    peer_lease_s: float = Field(LEASE_S, gt=0, description="How long another gateway of the run counts as alive after "
                                "its last GatewayJoined: while none is, this one reads tether.calls for their writes "
                                "once a second instead of as they are written.")
    max_body_bytes: int = Field(16 * 1024 * 1024, ge=1024)
    extendable_calls: int = Field(
        4, ge=0, description="How many of a rollout's latest answers a new call's record may extend (recorded as "
        "the difference: only the tokens and the part of the request it adds); 0 records every call whole.")
    token_cache_tokens: int = Field(
        2_000_000, ge=0, description="Token ids of long message pieces remembered across calls and rollouts (a "
        "harness's system prompt and tools, earlier turns), about 10 bytes each; 0: every call tokenised whole.")
    resume_rendering: bool = Field(
        True, description="A call that continues its rollout's previous one renders and tokenises only what it "
        "adds; false: every call rendered from its first message (the same ids, at a cost that grows with it).")
    render_check_every: int = Field(
        0, ge=0, description="Every Nth call is also rendered from its first message and "
        "tokenised afresh, and the two compared (a mismatch is logged, counted, and the fresh one used); 0: never, "
        "1: every call.")
    engine_kind: EngineKind = Field(
        "tether", description="What serves behind `engines`: asked in its own API which version each replica holds.")
    engine_check_s: float = Field(
        1.0, ge=0, description="How often each replica is asked which version it holds; calls go only to those "
                               "holding the current one (a restarted replica serves its launch weights until the "
                               "trainer brings it up). 0: never asked, every replica routed to.")
    engine_api_key: str | None = Field(
        None, description="Sent to the engines as a bearer token (vLLM's or SGLang's --api-key); not logged.",
        repr=False)
    engine_retries: int = Field(3, ge=0)
    engine_timeout_s: float = Field(600.0, gt=0)
    bus: BusSettings = Field(default_factory=BusSettings)

    @property
    def url(self) -> str:
        return self.public_url or f"http://{self.host}:{self.port}"

    def check_exposure(self) -> None:
        """Refuse a non-loopback address while a key is the built-in one: with it anyone who has read this
        file could mint a token for any rollout, or pause the run through /admin."""
        if is_loopback(self.host):
            return
        prefix = self.model_config.get("env_prefix", "")
        kept = [(f"{prefix}{name.upper()}", what) for name, what, default in (
            ("secret", "secret", DEVELOPMENT_SECRET), ("admin_key", "admin key", DEVELOPMENT_ADMIN_KEY))
            if getattr(self, name) == default]
        if kept:
            raise DevelopmentKeysExposed(
                f"refusing to serve on {self.host} with the built-in development "
                f"{' and '.join(what for _, what in kept)}: set {' and '.join(var for var, _ in kept)} "
                "(8+ characters; the controller's TETHER_CONTROLLER_GATEWAY_* to match), or serve on 127.0.0.1")

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        config = os.environ.get("TETHER_GATEWAY_CONFIG")
        files = (YamlConfigSettingsSource(settings_cls, yaml_file=config),) if config else ()
        return (init_settings, env_settings, *files)
