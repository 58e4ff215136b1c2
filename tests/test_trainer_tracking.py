"""Every update's metrics through verl's tracking layer: the names and values logged (pure), TensorBoard event
files that hold them, and a Weights & Biases run (offline: no account or network here) that holds them too."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from schemas.events import RolloutSample, TaskGroup
from trainer import config as config_module
from trainer.config import TrainerConfig, load_config
from trainer.errors import ConfigError
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


def wandb_records(run_file: Path) -> Iterator[Any]:
    """The records of a W&B run file: a `:W&B` header, then LevelDB's log format (32 KiB blocks of chunks, each
    checksum, length, type and data) around protobuf `Record`s. wandb itself keeps no Python reader of it."""
    from wandb.proto import wandb_internal_pb2

    data, block, pending = run_file.read_bytes(), 32 * 1024, b""
    assert data[:4] == b":W&B", "not a W&B run file"
    at = 7  # the header: ident, magic, version
    while at + 7 <= len(data):
        left = block - at % block
        length, kind = struct.unpack_from("<HB", data, at + 4)
        if left < 7 or kind == 0:  # a block's zero-filled tail
            at += left
            continue
        pending += data[at + 7:at + 7 + length]
        at += 7 + length
        if kind in (1, 4):  # a whole record, or its last chunk
            record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]  # generated, without stubs
            record.ParseFromString(pending)
            pending = b""
            yield record


def test_a_wandb_run_holds_every_update(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true"}.items():
        monkeypatch.setenv(name, value)
    config = TrainerConfig(run_id="run-wb", model=tmp_path, checkpoint_dir=tmp_path / "ckpt", logger=["wandb"],
                           project="tether-tests", lr=3e-4)
    tracker = open_tracking(config)
    groups = [group("a", [0.0, 1.0], 0)]
    for version in (1, 2):
        record = UpdateRecord(version=version, metrics=UpdateMetrics(loss=0.1 * version), mean_reward=0.5)
        tracker.log(scalars(record, groups, TIMING), step=version)
    tracker.finish()
    import wandb

    wandb.teardown()  # its service process, which would otherwise live as long as the test session
    [run_file] = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    records = list(wandb_records(run_file))
    [run] = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert (run.project, run.display_name) == ("tether-tests", "run-wb")
    settings = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert settings["trainer"]["lr"] == 3e-4 and settings["trainer"]["logger"] == ["wandb"]
    history = [{item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
               for r in records if r.WhichOneof("record_type") == "history"]
    assert [h["_step"] for h in history] == [1, 2]
    assert all(NAMES | {"reward_by_task/a"} <= h.keys() for h in history)
    assert [round(h["actor/loss"], 6) for h in history] == [0.1, 0.2]


def test_a_logger_whose_package_is_missing_is_named_when_the_file_is_read(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(config_module._LOGGER_PACKAGES, "mlflow", "tether_no_such_package")  # as if not installed
    (tmp_path / "trainer.yaml").write_text(yaml.safe_dump({"run_id": "r", "model": "m",
                                                           "logger": ["console", "mlflow"]}))
    with pytest.raises(ConfigError, match=r"trainer.yaml: logger: .*mlflow needs the tether_no_such_package "
                                          r"package, which is not installed here \(pip install "):
        load_config(tmp_path / "trainer.yaml")
    (tmp_path / "trainer.yaml").write_text(yaml.safe_dump({"run_id": "r", "model": "m", "logger": ["wandb"]}))
    assert load_config(tmp_path / "trainer.yaml").logger == ["wandb"]  # installed with Tether
