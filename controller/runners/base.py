"""The runner interface: start a harness, wait for it within a deadline, cancel it, find it again after a restart."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar


@dataclass(frozen=True, kw_only=True)
class Spec:
    """What every harness run has, whoever runs it: placeholders filled, environment complete. The controller
    records and finishes rollouts through these fields alone."""
    rollout_id: str
    run_id: str
    task_id: str
    attempt: int
    env: dict[str, str]
    log_path: Path


@dataclass(frozen=True, kw_only=True)
class ProcessSpec(Spec):
    """A run as a local process: its argv and working directory; `env` is its whole environment. `setup` runs
    first, in the same directory and environment, and must succeed for the harness to start."""
    argv: list[str]
    workdir: Path | None = None
    setup: list[str] | None = None


@dataclass(frozen=True, kw_only=True)
class JobSpec(Spec):
    """A run as a Kubernetes Job: the run's Job template, filled; `env` is injected into every container."""
    job: dict[str, Any]


@dataclass(frozen=True)
class Exit:
    """How a harness ended. `lost`: it could not start, or it is gone and nobody saw how it ended."""
    status: Literal["exited", "timeout", "cancelled", "lost"]
    exit_code: int | None = None
    reason: str | None = None


S_contra = TypeVar("S_contra", bound=Spec, contravariant=True)


class Runner(Protocol[S_contra]):
    """Runs one kind of spec: `Runner[ProcessSpec]` (local), `Runner[JobSpec]` (Kubernetes)."""

    async def start(self, spec: S_contra) -> None:
        """Start the harness; raise LaunchError when it cannot start (an infrastructure failure)."""

    async def attach(self, spec: S_contra) -> bool:
        """After a controller restart: is this rollout's harness still known (running or finished unseen)?"""

    async def wait(self, spec: S_contra, timeout_s: float) -> Exit:
        """Until it ends; past `timeout_s` stop it (TERM, grace, KILL) and report a timeout."""

    async def cancel(self, spec: S_contra) -> None:
        """Stop it now; its `wait` then returns `cancelled`."""

    async def close(self) -> None: ...
