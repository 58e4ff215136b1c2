"""Seeds end to end: a rollout's from the run's, a call's from its rollout's; the same inputs, the same seed."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from schemas.seeds import MAX_SEED, call_seed, rollout_seed

run_seeds = st.integers(0, MAX_SEED)
task_ids = st.text(max_size=40)
indexes = st.integers(0, 10_000)


@given(run_seeds, task_ids, indexes, st.booleans())
def test_a_rollouts_seed_is_a_63_bit_function_of_the_run_the_task_and_the_index(
        run_seed: int, task_id: str, index: int, validation: bool) -> None:
    seed = rollout_seed(run_seed, task_id, index, validation)
    assert 0 <= seed <= MAX_SEED and seed == rollout_seed(run_seed, task_id, index, validation)


@given(run_seeds, task_ids, st.lists(indexes, min_size=2, max_size=16, unique=True))
def test_the_rollouts_of_a_group_draw_apart_and_validation_apart_from_training(
        run_seed: int, task_id: str, slots: list[int]) -> None:
    training = [rollout_seed(run_seed, task_id, i) for i in slots]
    held_out = [rollout_seed(run_seed, task_id, i, validation=True) for i in slots]
    assert len(set(training + held_out)) == 2 * len(slots)


@given(run_seeds, st.lists(task_ids, min_size=2, max_size=8, unique=True))
def test_tasks_and_runs_draw_apart(run_seed: int, tasks: list[str]) -> None:
    assert len({rollout_seed(run_seed, t, 0) for t in tasks}) == len(tasks)
    assert rollout_seed(run_seed, tasks[0], 0) != rollout_seed(run_seed + 1, tasks[0], 0)


@given(st.integers(0, MAX_SEED), st.lists(st.integers(0, 100_000), min_size=1, max_size=32, unique=True))
def test_each_call_of_a_rollout_draws_its_own_seed(seed: int, seqs: list[int]) -> None:
    drawn = [call_seed(seed, s) for s in seqs]
    assert all(0 <= d <= MAX_SEED for d in drawn) and len(set(drawn)) == len(seqs)
    assert drawn == [call_seed(seed, s) for s in seqs]


def test_the_derivation_never_changes() -> None:
    """Recorded runs are repeated from their seeds: a change here would give an old run's rollouts other seeds."""
    assert rollout_seed(0, "t1", 0) == 4282343990202905183
    assert rollout_seed(7, "task/2", 3, validation=True) == 508795996409091855
    assert call_seed(11, 0) == 6756533012904912489
