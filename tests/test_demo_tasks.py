"""The demo's task files: training tasks drawn at the preset's depths, held-out tasks uniform over all depths."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from pydantic import ValidationError

from tether.demo import PRESETS, DemoSettings, _task_module


def test_training_depths_choose_the_training_tasks_only() -> None:
    settings = DemoSettings(task="lookup", training_depths=[3])
    demo_task = _task_module(settings)
    rng = random.Random(0)
    assert {demo_task.train(rng, i)["depth"] for i in range(50)} == {3}
    held = Counter(demo_task.make(rng, i)["depth"] for i in range(600))
    assert set(held) == {1, 2, 3} and min(held.values()) > 150  # uniform: about 200 each


def test_the_lookup_preset_weighs_deep_tasks_and_the_environment_overrides_it() -> None:
    assert DemoSettings(task="lookup").training_depths == PRESETS["lookup"]["training_depths"] == [1, 2, 3, 3]
    assert DemoSettings(task="lookup", training_depths=[1, 2, 3]).training_depths == [1, 2, 3]
    assert DemoSettings(task="letters").training_depths == [1, 2, 3]  # unused by letters


def test_a_depth_the_task_does_not_have_is_refused() -> None:
    with pytest.raises(ValidationError, match="training_depths"):
        DemoSettings(task="lookup", training_depths=[4])


def test_held_out_figures_come_from_the_controllers_reports_the_last_of_a_round_counting() -> None:
    """The summary reads the rounds from tether.control (as the trainer does), whichever stack ran them: a round
    reported again by a restarted controller counts once, with its last report."""
    from schemas.events import Event, GatewayLeft, ValidationReported, ValidationScore
    from tether.demo import validation_by_version

    def report(version: int, greedy: float, sampled: float) -> ValidationReported:
        return ValidationReported(run_id="r", version=version, scores=[
            ValidationScore(setting="t0", rollouts=8, mean_reward=greedy, temperature=0.0),
            ValidationScore(setting="harness", rollouts=8, mean_reward=sampled)])

    events: list[Event] = [report(6, 0.25, 0.5), GatewayLeft(run_id="r", gateway_id="g", reason="shut down"),
                           report(0, 0.0, 0.125), report(6, 0.375, 0.625)]
    assert validation_by_version(events) == {"t0": [(0, 0.0), (6, 0.375)], "harness": [(0, 0.125), (6, 0.625)]}
    assert validation_by_version([]) == {}
