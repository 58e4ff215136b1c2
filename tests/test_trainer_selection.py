"""Which groups an update takes (`trainer.selection.batch_size`): by count, or until B can be trained on."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from schemas.events import TaskGroup
from schemas.producer import EventProducer
from schemas.settings import BusSettings
from tests.test_trainer_loop import task_groups
from trainer.config import TrainerConfig
from trainer.loop import Trainer
from trainer.selection import Verdict, batch_size

verdicts = st.lists(st.sampled_from(["train", "stale", "no-signal"]), max_size=40)


@given(verdicts, st.integers(1, 8))
def test_by_count_an_update_takes_the_first_b_groups_whatever_they_hold(found: list[Verdict], b: int) -> None:
    assert batch_size(found, b, "groups", b) == (b if len(found) >= b else None)


@given(verdicts, st.integers(1, 8), st.integers(0, 24))
def test_filling_takes_the_shortest_prefix_with_b_to_train_on_or_the_cap(found: list[Verdict], b: int,
                                                                          extra: int) -> None:
    cap = b + extra
    size = batch_size(found, b, "signal", cap)
    trainable = [i for i, v in enumerate(found[:cap], start=1) if v == "train"]
    if len(trainable) >= b:
        assert size == trainable[b - 1]  # ends on the B-th trainable group: nothing taken beyond it
    elif len(found) >= cap:
        assert size == cap  # the cap: an update goes ahead with fewer than B rather than wait for ever
    else:
        assert size is None  # wait for more groups


@given(verdicts, verdicts, st.integers(1, 8), st.integers(0, 24), st.sampled_from(["groups", "signal"]))
def test_a_decision_does_not_change_as_more_groups_arrive(found: list[Verdict], later: list[Verdict], b: int,
                                                          extra: int, fill: str) -> None:
    """The trainer decides on what is buffered when it looks: a restarted trainer that sees more groups at once
    must cut the same batches (its offsets resume just past the last one)."""
    cap = b if fill == "groups" else b + extra
    size = batch_size(found, b, fill, cap)  # type: ignore[arg-type]
    if size is not None:
        assert batch_size(found + later, b, fill, cap) == size  # type: ignore[arg-type]
        assert 1 <= size <= cap


async def test_with_fill_signal_each_update_has_b_groups_to_learn_from(bus: BusSettings, tiny_model: Path,
                                                                      tmp_path: Path) -> None:
    """Against the broker: groups whose rewards are all equal do not count towards B; the cap lets an update go
    with fewer; every group is consumed once and counted where it was dropped. (The samples topic has several
    partitions, so the order groups arrive in is not the order they were published in.)"""
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    plan = "FSFFSSFSFSFS"  # F: rewards all equal, S: rewards that differ; 3 updates take 12 groups at most
    groups = [_rewarded(g, [1.0] * 4 if kind == "F" else [0.0, 1.0, 0.0, 1.0])
              for g, kind in zip(task_groups(run_id, len(plan)), plan, strict=True)]
    async with EventProducer(bus) as producer:
        await producer.publish_many(groups)
    config = TrainerConfig(run_id=run_id, model=tiny_model, checkpoint_dir=tmp_path / "ckpt", batch_groups=2,
                           max_updates=3, fill="signal", max_fill_groups=4, max_staleness=100)
    state = await asyncio.wait_for(Trainer(config, bus).run(), 300)
    kinds = {g.group_id: kind for g, kind in zip(groups, plan, strict=True)}
    for version, row in enumerate(state.history, start=1):
        taken = [kinds[g] for g, v in state.trained.items() if v == version]
        assert (row["task_groups"], row["dropped_no_signal"]) == (taken.count("S"), taken.count("F"))
        assert taken.count("S") == 2 or len(taken) == 4  # B to learn from, or the cap
        assert len(taken) <= 4 and taken.count("S") <= 2  # nothing taken beyond the B-th to learn from
    assert len(state.history) == 3


def test_the_cap_cannot_be_below_a_batch() -> None:
    with pytest.raises(ValidationError, match="max_fill_groups"):
        TrainerConfig(run_id="r", model=Path("m"), batch_groups=8, fill="signal", max_fill_groups=4)
    assert TrainerConfig(run_id="r", model=Path("m"), batch_groups=8, fill="signal").fill_cap == 32


def _rewarded(group: TaskGroup, rewards: list[float]) -> TaskGroup:
    assert len(group.rollouts) == len(rewards)
    return replace(group, rollouts=[replace(r, reward=x) for r, x in zip(group.rollouts, rewards, strict=True)])
