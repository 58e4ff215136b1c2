"""What `tether repro` chooses from a recorded run and how it orders it (pure: repro/rerun.py), and the hash that
says whether two runs gave the same training data."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller.config import keep_config, load_config
from repro.rerun import choose, phases, published, recorded
from schemas import events as ev
from schemas.rollout_ids import group_id, place, rollout_id
from stream_processors.pipeline import training_hash
from tests.factories import T0, task_groups


def started(run: str, task: str, slot: int, attempt: int = 0, version: int = 0, validation: str | None = None,
            seed: int = 1) -> ev.RolloutStarted:
    return ev.RolloutStarted(
        rollout_id=rollout_id(run, task, slot, attempt, validation), run_id=run,
        group_id=group_id(run, task, validation), task_id=task, task_json=json.dumps({"id": task, "q": task * 2}),
        group_size=4, attempt=attempt, weight_version=version, validation=validation is not None,
        temperature=0.0 if validation else None, seed=seed + slot)


def test_each_slot_stands_by_its_latest_attempt_and_held_out_ones_only_when_asked() -> None:
    events = [started("old", "t1", 0), started("old", "t1", 1), started("old", "t1", 1, attempt=1, seed=9),
              started("old", "t2", 0, validation="v0-greedy"), started("other", "t1", 0)]
    slots = recorded(events, "old")
    assert [(s.task_id, place(s.rollout_id)) for s in slots] == [
        ("t1", place("x.r0.a0")), ("t1", place("x.r1.a1")), ("t2", place("x.r0.a0"))]
    assert [s.task_id for s in choose(slots)] == ["t1", "t1"]
    assert [s.validation for s in choose(slots, validation=True)] == [False, False, True]
    assert choose(slots, tasks={"t2"}) == [] and len(choose(slots, tasks={"t2"}, validation=True)) == 1


@given(st.integers(1, 30), st.integers(1, 40), st.integers(0, 5))
def test_a_sample_is_the_same_every_time_in_the_records_order(slots: int, count: int, seed: int) -> None:
    recorded_slots = recorded([started("old", f"t{i % 3}", i) for i in range(slots)], "old")
    sample = choose(recorded_slots, count=count, sample_seed=seed)
    assert sample == choose(recorded_slots, count=count, sample_seed=seed)
    assert len(sample) == min(count, slots)
    assert sample == [s for s in recorded_slots if s in sample]  # a subsequence: the record's order


def test_phases_go_by_version_with_the_records_checkpoints_and_keep_names_seeds_and_settings() -> None:
    events: list[object] = [started("old", "t1", 0, version=2), started("old", "t1", 1, version=0),
                            started("old", "t2", 0, version=0, validation="v0-greedy"),
                            ev.WeightVersionPublished(run_id="old", version=2, checkpoint_path="/ckpt/v2")]
    found = phases(choose(recorded(events, "old"), validation=True), "old", "new", published(events, "old"))
    assert [(p.version, p.checkpoint) for p in found] == [(0, None), (2, "/ckpt/v2")]
    launches = [launch for p in found for launch in p.launches]
    assert [launch.rollout_id for launch in launches] == ["new.t1.r1.a0", "new.v0-greedy.t2.r0.a0", "new.t1.r0.a0"]
    assert [launch.seed for launch in launches] == [2, 1, 1]
    assert launches[1].validation and launches[1].temperature == 0.0 and launches[1].group_size == 4
    assert launches[0].task == {"id": "t1", "q": "t1t1"}


def test_a_version_without_its_checkpoint_cannot_be_run_again() -> None:
    events = [started("old", "t1", 0, version=3)]
    with pytest.raises(ValueError, match="version 3 of old has no checkpoint"):
        phases(recorded(events, "old"), "old", "new", published(events, "old"))


def _renamed(group: ev.TaskGroup, run: str, shuffle: bool) -> ev.TaskGroup:
    """The group as another run of the same tasks would publish it: its names under `run`, another time, its
    rollouts maybe in another order."""
    def rename(name: str) -> str:
        return f"{run}.{name.split('.', 1)[1]}"
    rollouts = [replace(r, rollout_id=rename(r.rollout_id)) for r in group.rollouts]
    return replace(group, run_id=run, group_id=rename(group.group_id), created_at=T0 + timedelta(hours=1),
                   rollouts=rollouts[::-1] if shuffle else rollouts,
                   dropped=[replace(d, rollout_id=rename(d.rollout_id)) for d in group.dropped])


@given(task_groups(), st.booleans())
def test_the_training_hash_is_blind_to_the_runs_names_and_times_and_to_nothing_trained(
        drawn: ev.TaskGroup, shuffle: bool) -> None:
    group = replace(drawn, run_id="old", group_id="old.t", rollouts=[
        replace(r, rollout_id=f"old.t.r{i}.a0") for i, r in enumerate(drawn.rollouts)],
        dropped=[replace(d, rollout_id=f"old.t.r{9 + i}.a1") for i, d in enumerate(drawn.dropped)])
    assert training_hash([group], "old") == training_hash([_renamed(group, "new", shuffle)], "new")
    assert training_hash([group], "old") != training_hash([replace(group, partial=not group.partial)], "old")
    if group.rollouts:
        first = group.rollouts[0]
        other = replace(first, reward=0.5 if first.reward != 0.5 else 0.25)
        moved = replace(group, rollouts=[other, *group.rollouts[1:]])
        assert training_hash([group], "old") != training_hash([moved], "old")


@pytest.mark.parametrize("example", ["claude_code/run.yaml", "codex/run.yaml", "mini_swe_agent/run.yaml",
                                     "swe/run.yaml", "swe/run-kubernetes.yaml"])
def test_the_run_file_the_controller_keeps_reads_back_as_the_run_it_ran(example: str, tmp_path: Path) -> None:
    """`tether repro RUN` runs again what the controller kept in the run's folder: every setting as it was."""
    examples = Path(__file__).parent.parent / "examples"
    config = load_config(examples / example).model_copy(update={"log_dir": tmp_path, "seed": 11})
    assert load_config(keep_config(config)) == config
