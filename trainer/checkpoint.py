"""Checkpoints: weights (safetensors), optimiser state, version, the sample offsets they consumed. Atomic.

A checkpoint is written into a staging folder and renamed into place, then
`LATEST` is replaced (write, fsync, rename): a crash at any point leaves the
previous checkpoint whole and named by `LATEST`. Offsets live in the checkpoint,
so a restarted trainer resumes exactly after the task groups the last update
used, and never trains one twice.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass(kw_only=True)
class TrainerState:
    """Where the run stands; committed with every checkpoint, so a restart resumes exactly here."""
    version: int = 0
    offsets: dict[str, int] = field(default_factory=dict)  # "partition" → next offset of tether.samples
    trained: dict[str, int] = field(default_factory=dict)  # task group id → the version its update produced
    history: list[dict[str, float]] = field(default_factory=list)  # metrics per update


def stage(root: Path, state: TrainerState, write: Callable[[Path], None]) -> Path:
    """Everything written and synced in a staging folder: `write` puts the backend's weights and optimiser
    there (for the torch learner, files the engine can load), then the state goes beside them."""
    staging = root / f".staging-v{state.version:06d}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    write(staging)
    (staging / "state.json").write_text(json.dumps(asdict(state)))
    for path in sorted(staging.rglob("*")):
        if path.is_file():
            with path.open("rb") as f:
                os.fsync(f.fileno())
    return staging


def commit(root: Path, staging: Path, version: int) -> Path:
    """Rename into place, then point LATEST at it: the moment the update counts."""
    final = root / f"v{version:06d}"
    shutil.rmtree(final, ignore_errors=True)  # one of this version whose LATEST was never written
    staging.rename(final)
    pointer = root / ".LATEST.tmp"
    pointer.write_text(final.name)
    with pointer.open("rb") as f:
        os.fsync(f.fileno())
    pointer.replace(root / "LATEST")
    return final


def latest(root: Path) -> Path | None:
    pointer = root / "LATEST"
    if not pointer.exists():
        return None
    folder = root / pointer.read_text().strip()
    return folder if (folder / "state.json").exists() else None


def load_state(folder: Path) -> TrainerState:
    raw: dict[str, Any] = json.loads((folder / "state.json").read_text())
    return TrainerState(**raw)
