"""Every update's metrics through verl's tracking layer: the names and values logged (pure), and TensorBoard
event files that hold them."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from schemas.events import RolloutSample, TaskGroup
from trainer.config import TrainerConfig
from trainer.metrics import UpdateMetrics, UpdateRecord
from trainer.tracking import Timing, open_tracking, scalars

TIMING = Timing(generation=3.0, drain=0.5, update=2.0, commit=0.25)
#: what every update logs, whatever its batch (per-task rewards come on top)
NAMES = {"reward/mean", "reward/std", "reward/min", "reward/max", "actor/loss", "actor/entropy", "actor/kl",
         "actor/clip_fraction", "actor/importance_weight_mean", "actor/grad_norm", "actor/optimizer_steps",
         "staleness/mean", "staleness/max", "batch/task_groups", "batch/task_groups_trained", "batch/rollouts",
         "batch/tokens", "batch/dropped_stale", "batch/dropped_no_signal", "timing_s/generation", "timing_s/drain",
         "timing_s/update", "timing_s/commit", "weight_version"}


def group(task: str, rewards: list[float], n: int) -> TaskGroup:
    rollouts = [RolloutSample(rollout_id=f"{task}.g{n}.r{i}", reward=r, status="succeeded", segments=[])
                for i, r in enumerate(rewards)]
    return TaskGroup(group_id=f"{task}.g{n}", run_id="run", task_id=task, group_size=len(rewards), rollouts=rollouts)


def tensorboard_scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    found = EventAccumulator(str(folder), size_guidance={"scalars": 0}).Reload()
    return {tag: [(e.step, e.value) for e in found.Scalars(tag)] for tag in found.Tags()["scalars"]}


rewards = st.lists(st.floats(-1, 1, allow_nan=False), min_size=1, max_size=4)


@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), rewards), min_size=1, max_size=6))
def test_rewards_by_batch_and_by_task(batch: list[tuple[str, list[float]]]) -> None:
    groups = [group(task, values, n) for n, (task, values) in enumerate(batch)]
    every = [v for _, values in batch for v in values]
    record = UpdateRecord(version=3, metrics=UpdateMetrics(loss=0.5), mean_reward=sum(every) / len(every))
    logged = scalars(record, groups, TIMING)
    assert logged.keys() >= NAMES
    assert {k.removeprefix("reward_by_task/") for k in logged.keys() - NAMES} == {t for t, _ in batch}
    assert logged["reward/min"] <= logged["reward/mean"] + 1e-9 and logged["reward/mean"] <= logged["reward/max"] + 1e-9
    for task, _ in batch:
        values = [v for t, vs in batch if t == task for v in vs]
        assert abs(logged[f"reward_by_task/{task}"] - sum(values) / len(values)) < 1e-9
    assert logged["batch/rollouts"] == len(every) and logged["weight_version"] == 3.0
    assert logged["timing_s/generation"] == 3.0 and logged["actor/loss"] == 0.5


def test_tensorboard_event_files_under_the_run_hold_every_update(tmp_path: Path) -> None:
    config = TrainerConfig(run_id="run-tb", model=tmp_path, checkpoint_dir=tmp_path / "ckpt", logger=["tensorboard"])
    tracker = open_tracking(config)
    groups = [group("a", [0.0, 1.0], 0), group("b", [1.0, 1.0], 1)]
    for version in (1, 2):
        record = UpdateRecord(version=version, metrics=UpdateMetrics(loss=0.1 * version), mean_reward=0.75)
        tracker.log(scalars(record, groups, TIMING), step=version)
    found = tensorboard_scalars(tmp_path / "ckpt" / "run-tb" / "tensorboard")  # before finish: flushed per update
    tracker.finish()
    assert NAMES | {"reward_by_task/a", "reward_by_task/b"} <= found.keys()
    assert [step for step, _ in found["actor/loss"]] == [1, 2]
    assert [round(v, 6) for _, v in found["actor/loss"]] == [0.1, 0.2]
    assert found["reward_by_task/a"] == [(1, 0.5), (2, 0.5)]
