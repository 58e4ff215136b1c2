"""What an update measured, typed: the backend's numbers, and the loop's record that becomes one `TrainerStep`.

A backend returns `UpdateMetrics`; the loop adds what it decided (the version,
the groups it dropped, the mean reward) in an `UpdateRecord`, which is
published as a `TrainerStep` and kept in the checkpoint's history as a row of
numbers (`row`), the form `state.json` has always held.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from schemas.events import RolloutAdvantage, TrainerStep


@dataclass(frozen=True, kw_only=True)
class UpdateMetrics:
    """One update as a backend measured it; all zeros is the update that had nothing to learn from."""
    loss: float = 0.0
    entropy: float = 0.0
    clip_fraction: float = 0.0
    kl: float = 0.0
    is_weight_mean: float = 0.0
    grad_norm: float = 0.0
    optimizer_steps: int = 0
    tokens: int = 0  # trainable tokens in the batch
    task_groups: int = 0
    staleness_mean: float = 0.0  # versions between a trainable token's sampling and this update
    staleness_max: float = 0.0
    seconds: float = 0.0


@dataclass(frozen=True, kw_only=True)
class UpdateRecord:
    """One update as the run records it: the backend's metrics and the loop's choices around them."""
    version: int
    metrics: UpdateMetrics
    mean_reward: float  # over every group of the batch, the dropped ones too
    dropped_stale: int = 0
    dropped_no_signal: int = 0
    time: float = 0.0  # wall-clock time of the record (seconds since the epoch)
    advantages: list[RolloutAdvantage] = field(default_factory=list)  # published, not kept in the history

    def event(self, run_id: str) -> TrainerStep:
        m = self.metrics
        return TrainerStep(
            run_id=run_id, version=self.version, task_groups=m.task_groups, tokens=m.tokens,
            mean_reward=self.mean_reward, loss=m.loss, entropy=m.entropy, clip_fraction=m.clip_fraction, kl=m.kl,
            grad_norm=m.grad_norm, staleness_mean=m.staleness_mean, staleness_max=m.staleness_max,
            dropped_stale=self.dropped_stale, dropped_no_signal=self.dropped_no_signal, seconds=m.seconds,
            advantages=self.advantages)

    def row(self) -> dict[str, float]:
        """The record as `TrainerState.history` keeps it (JSON numbers under the names the plots read)."""
        return {**{k: float(v) for k, v in asdict(self.metrics).items()}, "version": float(self.version),
                "mean_reward": self.mean_reward, "dropped_stale": float(self.dropped_stale),
                "dropped_no_signal": float(self.dropped_no_signal), "time": self.time}
