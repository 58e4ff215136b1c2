"""The runner interface: start a harness, wait for it within a deadline, cancel it, find it again after a restart."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol


@dataclass(frozen=True)
class Spec:
    """One harness run, fully resolved: placeholders filled, environment complete."""
    rollout_id: str
    run_id: str
    task_id: str
    attempt: int
    argv: list[str] | None  # local runner
    job: dict[str, Any] | None  # kubernetes runner: the filled Job template
    env: dict[str, str]
    log_path: Path
    workdir: Path | None = None


@dataclass(frozen=True)
class Exit:
    """How a harness ended. `lost`: it could not start, or it is gone and nobody saw how it ended."""
    status: Literal["exited", "timeout", "cancelled", "lost"]
    exit_code: int | None = None
    reason: str | None = None


class Runner(Protocol):
    async def start(self, spec: Spec) -> None:
        """Start the harness; raise LaunchError when it cannot start (an infrastructure failure)."""

    async def attach(self, spec: Spec) -> bool:
        """After a controller restart: is this rollout's harness still known (running or finished unseen)?"""

    async def wait(self, spec: Spec, timeout_s: float) -> Exit:
        """Until it ends; past `timeout_s` stop it (TERM, grace, KILL) and report a timeout."""

    async def cancel(self, spec: Spec) -> None:
        """Stop it now; its `wait` then returns `cancelled`."""

    async def close(self) -> None: ...
