"""Which versions the controller validates, from the control log alone: pure, no broker."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from controller.plan import RunState
from controller.validation import Setting, due
from schemas.events import UpdateAborted, UpdateRequested, ValidationStarted, WeightVersionPublished


def state_at(version: int) -> RunState:
    state = RunState("r", group_size=2, max_attempts=1)
    if version:
        state.apply(WeightVersionPublished(run_id="r", version=version))
    return state


@given(st.integers(0, 60), st.integers(1, 10), st.booleans())
def test_the_first_every_nth_and_the_final_version_are_due_once(version: int, every: int, final: bool) -> None:
    state = state_at(version)
    if final:
        state.apply(WeightVersionPublished(run_id="r", version=version, final=True))
    assert state.round_due(every) == (version == 0 or version % every == 0 or final) == due(version, every, final)
    state.apply(ValidationStarted(run_id="r", version=version, rollouts=1))
    assert not state.round_due(every)  # one round per version


def test_a_version_whose_next_update_is_pending_is_let_go_until_that_update_is_aborted() -> None:
    state = state_at(4)
    state.apply(UpdateRequested(run_id="r", version=5, n_task_groups=8))
    assert not state.round_due(2)  # its rollouts would be served by version 5
    state.apply(UpdateAborted(run_id="r", version=5, reason="drain timed out"))
    assert state.round_due(2)  # the engine still serves 4, and no update is pending
    state.apply(UpdateRequested(run_id="r", version=5, n_task_groups=8))
    state.apply(WeightVersionPublished(run_id="r", version=5))
    assert not state.round_due(2) and state.round_due(5)


def test_settings_are_named_for_what_they_pin() -> None:
    assert [Setting(t).name for t in (0.0, None, 0.7)] == ["greedy", "harness", "t=0.7"]
    assert [Setting(t).slug for t in (0.0, None, 0.7)] == ["greedy", "harness", "t0_7"]
