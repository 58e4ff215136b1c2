"""Every update's numbers where people watch training: verl's tracking layer (console, TensorBoard, W&B, MLflow...).

`scalars` is pure: an update's record and its batch → the names and values
logged, in verl's `section/name` style; `validation_scalars` the same for a
held-out validation round (`val/...`). `open_tracking` starts verl's
`Tracking` for the run with TensorBoard's event files under the run's folder.
"""

from __future__ import annotations

import os
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from schemas.events import TaskGroup, ValidationReported
from trainer.config import TrainerConfig
from trainer.metrics import UpdateRecord


@dataclass(frozen=True, kw_only=True)
class Timing:
    """Where an update's wall-clock time went, in seconds."""
    generation: float  # from the previous update's end to this batch being complete: the agents at work
    drain: float  # waiting for every gateway to pause
    update: float  # the backend's update
    commit: float  # checkpoint staged, loaded into the engine, committed


def scalars(record: UpdateRecord, groups: Sequence[TaskGroup], timing: Timing) -> dict[str, float]:
    """What one update logs. Rewards are over every rollout of the batch, dropped groups included."""
    m = record.metrics
    rewards = [r.reward for g in groups for r in g.rollouts]
    by_task: dict[str, list[float]] = defaultdict(list)
    for g in groups:
        by_task[g.task_id].extend(r.reward for r in g.rollouts)
    out = {
        "reward/mean": record.mean_reward,
        "reward/std": statistics.pstdev(rewards) if rewards else 0.0,
        "reward/min": min(rewards, default=0.0),
        "reward/max": max(rewards, default=0.0),
        "actor/loss": m.loss, "actor/entropy": m.entropy, "actor/kl": m.kl, "actor/clip_fraction": m.clip_fraction,
        "actor/importance_weight_mean": m.is_weight_mean, "actor/grad_norm": m.grad_norm,
        "actor/optimizer_steps": float(m.optimizer_steps),
        "staleness/mean": m.staleness_mean, "staleness/max": m.staleness_max,
        "batch/task_groups": float(len(groups)), "batch/task_groups_trained": float(m.task_groups),
        "batch/rollouts": float(len(rewards)), "batch/tokens": float(m.tokens),
        "batch/dropped_stale": float(record.dropped_stale), "batch/dropped_no_signal": float(record.dropped_no_signal),
        "timing_s/generation": timing.generation, "timing_s/drain": timing.drain, "timing_s/update": timing.update,
        "timing_s/commit": timing.commit, "weight_version": float(record.version),
    }
    for task, values in sorted(by_task.items()):
        out[f"reward_by_task/{task}"] = sum(values) / len(values)
    return out


def validation_scalars(report: ValidationReported) -> dict[str, float]:
    """A validation round's figures, logged at the step of the version it validated."""
    out: dict[str, float] = {"val/seconds": report.seconds}
    for s in report.scores:
        out[f"val/{s.setting}/reward"] = s.mean_reward
        out[f"val/{s.setting}/rollouts"] = float(s.rollouts)
        out[f"val/{s.setting}/unrewarded"] = float(s.unrewarded)
        out[f"val/{s.setting}/duration_s"] = s.duration_s
    return out


class Tracker(Protocol):
    def log(self, data: dict[str, float], step: int) -> None: ...

    def finish(self) -> None: ...


def open_tracking(config: TrainerConfig) -> Tracker:
    """verl's `Tracking` on the config's `logger` list; TensorBoard writes to the run's `tensorboard/`."""
    from verl.utils.tracking import Tracking

    folder = config.tensorboard_dir or config.run_dir / "tensorboard"
    saved = os.environ.get("TENSORBOARD_DIR")
    os.environ["TENSORBOARD_DIR"] = str(folder)  # verl's adapter reads its folder from here, once
    try:
        # the run's config under `trainer`, where verl keeps its own trainer's (its W&B adapter reads it there)
        tracking: Any = Tracking(project_name=config.project, experiment_name=config.run_id,
                                 default_backend=list(config.logger),
                                 config={"trainer": config.model_dump(mode="json")})
    finally:
        if saved is None:
            os.environ.pop("TENSORBOARD_DIR", None)
        else:
            os.environ["TENSORBOARD_DIR"] = saved
    return _Flushing(tracking)


class _Flushing:
    """verl's Tracking, with TensorBoard's event file flushed after every update (verl leaves it to the writer's
    own timer): a run watched live, and one killed, shows every update."""

    def __init__(self, tracking: Any) -> None:
        self._tracking = tracking

    def log(self, data: dict[str, float], step: int) -> None:
        self._tracking.log(data=data, step=step)
        board = self._tracking.logger.get("tensorboard")
        if board is not None:
            board.writer.flush()

    def finish(self) -> None:
        self._tracking.finish()
