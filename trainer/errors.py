"""Errors of the trainer.

    TrainerError
    ├── ConfigError      the trainer's configuration is invalid (names the field)
    ├── CheckpointMismatch  a checkpoint does not fit what restores it (an adapter trained on another base)
    ├── DrainTimeout     a gateway did not report GatewayDrained in time (the update is aborted)
    ├── EngineError      the engine refused or did not load a new weight version
    ├── WorkersLost      a worker of the verl backend died, or its process group broke
    └── UpdateFailed     an update was not applied (workers lost); the backend is ready again from the checkpoint
"""

from __future__ import annotations


class TrainerError(Exception):
    pass


class ConfigError(TrainerError):
    pass


class CheckpointMismatch(TrainerError):
    pass


class DrainTimeout(TrainerError):
    pass


class EngineError(TrainerError):
    pass


class UpdateFailed(TrainerError):
    pass


class WorkersLost(TrainerError):
    pass
