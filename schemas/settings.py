"""How a process reaches the bus, and as whom; read once from TETHER_BUS_* variables."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, FilePath, SecretStr, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from schemas.topics import DEADLETTER

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"]


def min_insync_replicas(replication_factor: int) -> int:
    """2 of 3 copies: acks=all survives one broker down and never rests on a single copy."""
    return 2 if replication_factor >= 3 else 1


class BusSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TETHER_BUS_", frozen=True)

    bootstrap_servers: str = Field("127.0.0.1:9092", description="Kafka bootstrap servers, comma-separated.")
    client_id: str = "tether"
    replication_factor: int | None = Field(
        None, ge=1, description="For topics this process creates; unset: the cluster's broker count, at most 3.")
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
    security_protocol: SecurityProtocol = Field("PLAINTEXT", description="SASL_SSL on a production cluster.")
    sasl_mechanism: SaslMechanism = Field("SCRAM-SHA-512", description="With SASL_*: how the user logs in.")
    username: str | None = Field(None, description="With SASL_*: this service's Kafka user (its principal).")
    password: SecretStr | None = Field(None, validate_default=True, description="With SASL_*: that user's password.")
    ca_file: FilePath | None = Field(None, description="With SSL/SASL_SSL: PEM CA bundle to trust; unset: the "
                                     "system's.")
    cert_file: FilePath | None = Field(None, description="With SSL/SASL_SSL: PEM client certificate (mutual TLS).")
    key_file: FilePath | None = Field(None, validate_default=True, description="The client certificate's key (PEM).")

    @field_validator("password")
    @classmethod
    def _sasl_has_a_user(cls, password: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        protocol = info.data.get("security_protocol", "")
        if protocol.startswith("SASL_") and (not info.data.get("username") or password is None):
            raise ValueError(f"security_protocol {protocol} needs a username and a password")
        return password

    @field_validator("key_file")
    @classmethod
    def _key_goes_with_cert(cls, key_file: FilePath | None, info: ValidationInfo) -> FilePath | None:
        if (key_file is None) != (info.data.get("cert_file") is None):
            raise ValueError("a client certificate needs its key, and a key its certificate")
        return key_file

    @property
    def sasl(self) -> bool:
        return self.security_protocol.startswith("SASL_")

    @property
    def tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def sasl_login(self) -> tuple[str, str] | None:
        """(username, password) with SASL_* (the validators require both there), else None."""
        if not self.sasl or self.username is None or self.password is None:
            return None
        return self.username, self.password.get_secret_value()

    @property
    def principal(self) -> str:
        """Who Kafka's authorizer sees, as its ACLs name it."""
        if self.sasl:
            return f"User:{self.username}"
        if self.cert_file is not None:
            return f"User:<subject of {self.cert_file.name}>"
        return "User:ANONYMOUS"
