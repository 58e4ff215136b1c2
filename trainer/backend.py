"""The seam between the loop and whatever updates the policy: the loop is given an `UpdateBackend`.

The loop (`trainer/loop.py`) owns the handshake, the batches and the
checkpoint's commit; a backend owns the weights: it trains on a batch of task
groups and writes its weights and optimiser into a staging folder. Two
implement it, chosen by the trainer config's `backend`:

    torch   the embedded learner (`trainer/learner.py`): model, optimiser and reference in this process
    verl    verl's own actor workers (`trainer/verl/backend.py`): FSDP2 on Ray, `workers` of them

`tests/test_trainer_backends.py` holds both to the same contract.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import torch

from trainer.advantages import ScoredGroups
from trainer.checkpoint import TrainerState
from trainer.config import TrainerConfig
from trainer.engines.broadcast import Sender
from trainer.metrics import UpdateMetrics


class UpdateBackend(Protocol):
    """What the loop asks of the thing that trains the policy."""

    def update(self, scored: ScoredGroups, version: int) -> UpdateMetrics:
        """Train on the scored groups, each token taking the advantage the loop gave its rollout or call (the
        policy is at `version`; staleness is measured from it). No groups: no update,
        zero metrics, the policy as it was (the loop still advances the version)."""
        ...

    def stage(self, root: Path, state: TrainerState) -> Path:
        """Weights, optimiser and `state` written and synced in a staging folder under `root`, for
        `checkpoint.commit`; restoring from the committed folder is the backend's own constructor's job. The
        folder's top level is a Hugging Face model folder: what the inference engines load."""
        ...

    def weight_sender(self, kind: str) -> Sender:
        """The trainer's side of a weight group to `kind` engines (transfer: distributed), sending from wherever
        this backend holds the weights."""
        ...

    def close(self) -> None:
        """Release what the backend started (processes, a cluster connection)."""
        ...


def open_backend(config: TrainerConfig, device: torch.device, found: Path | None) -> UpdateBackend:
    """The backend `config.backend` names, restored from the checkpoint `found` if there is one."""
    if config.backend == "torch":
        from trainer.learner import TorchLearner

        return TorchLearner.load(config, device, found)
    from trainer.verl.backend import VerlBackend
    from trainer.verl.workers import VerlWorkers

    return VerlBackend.open(config, VerlWorkers.start(config, config.workers), found)
