"""Sample assembly, the rollout join and grouping: pure functions, property-tested."""

from __future__ import annotations

import random

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.events import Event, ModelCall, RolloutFinished, RolloutSealed, RolloutStarted, rollout_of
from stream_processors.assembly import Call, assemble
from stream_processors.call_store import MemoryCalls
from stream_processors.grouping import GroupState, Policy
from stream_processors.join import RolloutJoin
from stream_processors.pipeline import content_hash, rebuild, rollout_step
from tests.factories import synthetic_run

token_lists = st.lists(st.integers(3, 999), min_size=1, max_size=20)


@st.composite
def trajectories(draw: st.DrawFn) -> list[Call]:
    """A non-compacting harness: each prompt is the previous prompt + response + a gap."""
    prompt = draw(token_lists)
    calls = []
    for seq in range(draw(st.integers(1, 6))):
        response = draw(token_lists)
        calls.append(Call(f"c{seq}", seq, 0, list(prompt), response, [-0.5] * len(response), seq // 2))
        prompt = prompt + response + draw(st.lists(st.integers(3, 999), max_size=5))
    return calls


@given(trajectories(), st.randoms())
def test_a_non_compacting_rollout_is_one_segment(calls: list[Call], rng: random.Random) -> None:
    shuffled = list(calls)
    rng.shuffle(shuffled)
    (segment,) = assemble(shuffled)  # arrival order does not matter: seq does
    last = calls[-1]
    assert segment.token_ids == [*last.prompt_token_ids, *last.response_token_ids]
    trained = [t for t, m in zip(segment.token_ids, segment.loss_mask, strict=True) if m]
    assert trained == [t for c in calls for t in c.response_token_ids]
    assert [lp for lp, m in zip(segment.logprobs, segment.loss_mask, strict=True) if not m] == \
        [0.0] * segment.loss_mask.count(False)  # gaps carry no behaviour logprob
    versions = [v for v, m in zip(segment.weight_versions, segment.loss_mask, strict=True) if m]
    assert versions == [c.weight_version for c in calls for _ in c.response_token_ids]


@given(trajectories(), token_lists)
def test_a_prompt_that_does_not_extend_starts_a_new_segment(calls: list[Call], other: list[int]) -> None:
    restart = Call("x", len(calls), 0, [1, 2, *other], [7, 8], [-1.0, -1.0], 0)
    segments = assemble([*calls, restart])
    assert len(segments) == 2
    assert segments[1].token_ids == [1, 2, *other, 7, 8]
    assert segments[1].loss_mask == [False] * (len(other) + 2) + [True, True]


def test_failed_calls_and_empty_responses_add_nothing() -> None:
    calls = [Call("a", 0, 0, [1, 2], [3], [-0.1], 0), Call("b", 1, 0, [1, 2, 3, 4], [], [], 0),
             Call("c", 2, 0, [1, 2, 3, 4], [5], [-0.2], 0, ok=False)]
    assert [s.token_ids for s in assemble(calls)] == [[1, 2, 3]]


def shuffle_within_rollouts(events: list[Event], rng: random.Random, duplicates: int) -> list[Event]:
    """Interleave rollouts, reorder each rollout's events arbitrarily, and deliver some twice."""
    picked = [*events, *rng.sample(events, duplicates)]
    rng.shuffle(picked)
    return picked


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32), st.integers(0, 30))
def test_any_order_and_duplicates_give_the_same_groups(seed: int, duplicates: int) -> None:
    events = synthetic_run("run", groups=3, group_size=3, seed=seed % 1000, failing=0.2, compacting=0.3)
    reference = rebuild(events, "run", Policy())
    assert len(reference) == 3 and not any(g.partial for g in reference)
    mixed = shuffle_within_rollouts(events, random.Random(seed), duplicates)
    assert content_hash(rebuild(mixed, "run", Policy())) == content_hash(reference)


def test_policies_for_failed_rollouts() -> None:
    events = synthetic_run("run", groups=1, group_size=4, seed=3)
    failed = next(e for e in events if isinstance(e, RolloutFinished))
    events = [RolloutFinished(rollout_id=e.rollout_id, run_id=e.run_id, status="timeout", duration_s=9,
                              reason="too slow", finished_at=e.finished_at) if e is failed else e for e in events]
    (dropped,) = rebuild(events, "run", Policy(failed="drop"))
    assert len(dropped.rollouts) == 3 and [(d.rollout_id, d.status, d.reason) for d in dropped.dropped] == \
        [(failed.rollout_id, "timeout", "too slow")] and not dropped.partial
    (filled,) = rebuild(events, "run", Policy(failed="fill", fill_reward=-1.0))
    sample = next(r for r in filled.rollouts if r.rollout_id == failed.rollout_id)
    assert (sample.reward, sample.filled, sample.status) == (-1.0, True, "timeout") and not filled.dropped


def test_retried_attempts_do_not_count_and_a_stuck_group_is_partial() -> None:
    events = synthetic_run("run", groups=1, group_size=2, seed=4)
    lost = next(e for e in events if isinstance(e, RolloutFinished))
    events = [RolloutFinished(rollout_id=lost.rollout_id, run_id="run", status="lost", duration_s=1,
                              reason="vanished", finished_at=lost.finished_at) if e is lost else e for e in events]
    (group,) = rebuild(events, "run", Policy())  # the retry never came: only partial
    assert group.partial and len(group.rollouts) == 1 and group.dropped[0].status == "lost"
    retry: list[Event] = [
        RolloutStarted(rollout_id="retry", run_id="run", group_id=group.group_id, task_id=group.task_id,
                       task_json="{}", group_size=2, attempt=1, retry_of=lost.rollout_id),
        RolloutSealed(rollout_id="retry", run_id="run", call_ids=[]),
        RolloutFinished(rollout_id="retry", run_id="run", status="succeeded", duration_s=1, reward=1.0)]
    (complete,) = rebuild(events + retry, "run", Policy())
    assert not complete.partial and {r.rollout_id for r in complete.rollouts} == {"retry", *(
        r.rollout_id for r in group.rollouts)} and not complete.dropped


def test_a_rollout_waits_for_every_sealed_call() -> None:
    events = synthetic_run("run", groups=1, group_size=1, seed=5, calls=(3, 3))
    calls = [e for e in events if isinstance(e, ModelCall)]
    without_last = [e for e in events if e is not calls[-1]]
    assert rebuild(without_last, "run", Policy()) == []  # sealed with 3 calls, 2 arrived: not complete
    (group,) = rebuild([*without_last, calls[-1]], "run", Policy())
    assert not group.partial and len(group.rollouts) == 1


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 1000), st.integers(1, 4))
def test_a_group_state_reads_back_what_it_wrote_and_the_older_layout(seed: int, size: int) -> None:
    """The groups table's bytes: a header line, then a line per rollout; a state written before that (the
    rollouts as JSON strings inside the header) still loads, to the same group."""
    events = synthetic_run("run", groups=1, group_size=size, seed=seed, compacting=0.3)
    joins: dict[str, RolloutJoin] = {}
    calls = MemoryCalls()
    state = GroupState("run.task0", 12.5)
    for event in events:
        rid = rollout_of(event)
        assert rid is not None
        _, done = rollout_step(joins.setdefault(rid, RolloutJoin(rid)), calls, event)
        if done is not None and len(state.rollouts) < size - 1:
            state.add(done, done.dumps() if len(state.rollouts) % 2 else None)
    older = orjson.dumps({"group_id": state.group_id, "first_seen": state.first_seen, "emitted": False,
                          "rollouts": {rid: r.dumps().decode() for rid, r in state.rollouts.items()}})
    for data in (state.dumps(), older):
        again = GroupState.loads(data)
        assert (again.group_id, again.first_seen, again.emitted) == ("run.task0", 12.5, False)
        assert again.members() == state.members()
    state.clear()
    state.emitted = True
    marker = GroupState.loads(state.dumps())
    assert marker.emitted and not marker.rollouts


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 2**32), st.integers(0, 10))
def test_validation_rollouts_never_become_samples(seed: int, duplicates: int) -> None:
    """Held-out rollouts are joined (their state closes like any other) but no task group ever holds one, in any
    order of their events; the training groups beside them come out as they would alone."""
    training = synthetic_run("run", groups=2, group_size=2, seed=seed % 1000)
    held_out = [RolloutStarted(**{**{f: getattr(e, f) for f in e.__dataclass_fields__}, "validation": True,
                                  "group_id": e.group_id.replace("run.", "run.val3-greedy.")})
                if isinstance(e, RolloutStarted) else e
                for e in synthetic_run("run", groups=2, group_size=2, seed=seed % 1000 + 1)
                for e in [_renamed(e, "v-")]]
    alone = rebuild(training, "run", Policy())
    mixed = shuffle_within_rollouts(training + held_out, random.Random(seed), duplicates)
    assert content_hash(rebuild(mixed, "run", Policy())) == content_hash(alone)
    assert not any(r.rollout_id.startswith("v-") for g in rebuild(mixed, "run", Policy()) for r in g.rollouts)
    joins: dict[str, RolloutJoin] = {}
    calls = MemoryCalls()
    for event in held_out:
        rid = rollout_of(event)
        assert rid is not None
        _, result = rollout_step(joins.setdefault(rid, RolloutJoin(rid)), calls, event)
        assert result is None
    assert all(j.done for j in joins.values()) and not calls.of(next(iter(joins)))


def _renamed(event: Event, prefix: str) -> Event:
    """The event about another rollout (`prefix` + its id), as a second run's would be."""
    fields = {f: getattr(event, f) for f in event.__dataclass_fields__}
    fields["rollout_id"] = prefix + fields["rollout_id"]
    if isinstance(event, RolloutSealed):
        fields["call_ids"] = [prefix + c for c in event.call_ids]
    if isinstance(event, ModelCall):
        fields["call_id"] = prefix + event.call_id
        if event.extends is not None:
            fields["extends"] = prefix + event.extends
    return type(event)(**fields)
