"""The secured cluster's SCRAM users: a random password per user, made once and kept in the state folder.

Users are created when a node's storage is formatted (`kafka-storage format --add-scram`), so a secured
cluster has them before it first answers; the passwords stay readable only by this account (mode 0600) and
are handed to services as TETHER_BUS_USERNAME / TETHER_BUS_PASSWORD (`tether kafka env SERVICE`).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path

from infra.errors import BrokerStartFailed
from infra.kafka.config import SCRAM


@dataclass(frozen=True)
class Users:
    folder: Path

    def ensure(self, names: tuple[str, ...]) -> None:
        """A password for each user that has none yet (hex: the storage tool's argument syntax needs no quoting)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        self.folder.chmod(0o700)
        for name in names:
            path = self._file(name)
            if not path.exists():
                path.touch(mode=0o600)
                path.write_text(secrets.token_hex(24))

    def password(self, name: str) -> str:
        try:
            return self._file(name).read_text().strip()
        except OSError as exc:
            raise BrokerStartFailed(f"no password for Kafka user {name!r} in {self.folder}: is this cluster "
                                    "secured (TETHER_KAFKA_SECURITY=sasl_ssl) and started once?") from exc

    def format_args(self, names: tuple[str, ...]) -> list[str]:
        """`--add-scram` arguments creating every user at format time."""
        return [arg for name in names
                for arg in ("--add-scram", f"{SCRAM}=[name={name},password={self.password(name)}]")]

    def _file(self, name: str) -> Path:
        return self.folder / f"{name}.password"
