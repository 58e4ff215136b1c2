"""Calls recorded as what they add to the call they extend: rebuilt whole, joined and grouped exactly as whole
calls are. Pure: the gateway's choice of what a call extends, schemas.calls, the join."""

from __future__ import annotations

import random
from dataclasses import replace

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.extends import extension, tip
from schemas.calls import MissingCall, Wholes, join_request, split_request, whole
from schemas.events import Event, ModelCall, RolloutFinished, RolloutSealed, RolloutStarted
from stream_processors.assembly import assemble
from stream_processors.grouping import Policy
from stream_processors.join import call_of
from stream_processors.pipeline import content_hash, rebuild
from tests.factories import T0, as_recorded, example, synthetic_run

texts = st.text(alphabet="ab{}[]\",:xyz", max_size=60)


@given(texts, texts)
def test_a_request_is_its_base_s_head_the_middle_and_its_base_s_tail(base: str, request: str) -> None:
    head, tail, middle = split_request(base, request)
    assert join_request(base, head, tail, middle) == request
    assert head + tail <= min(len(base), len(request))
    assert base[:head] == request[:head] and (head == min(len(base), len(request)) or base[head] != request[head])


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 3), st.integers(0, 20_000), st.integers(0, 20_000), st.integers(0, 20_000), texts)
def test_long_requests_split_at_their_first_and_last_difference(seed: int, size: int, cut: int, resume: int,
                                                                  inserted: str) -> None:
    """Past the chunk the comparison steps by: the head and tail are still the longest there are."""
    base = "".join("abc{}"[(i * 7 + seed * i // 13) % 5] for i in range(size))
    cut, resume = min(cut, size), min(max(cut, resume), size)
    request = base[:cut] + inserted + base[resume:]
    head, tail, middle = split_request(base, request)
    assert join_request(base, head, tail, middle) == request
    shortest = min(len(base), len(request))
    assert base[:head] == request[:head] and (head == shortest or base[head] != request[head])
    assert head + tail == shortest or base[len(base) - tail - 1] != request[len(request) - tail - 1]


def test_a_long_request_that_adds_a_message_in_the_middle_is_recorded_as_that_message() -> None:
    tools = ', "tools": [' + ", ".join(f'{{"name": "t{i}"}}' for i in range(2000)) + "]}"
    base = '{"messages": [' + ", ".join(f'"m{i}"' for i in range(3000)) + "]" + tools
    request = base.replace('"m2999"]', '"m2999", "the tool said 42"]')
    head, tail, middle = split_request(base, request)
    assert middle == ', "the tool said 42"' and join_request(base, head, tail, middle) == request


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.floats(0, 0.6))
def test_recorded_calls_made_whole_are_the_calls_as_served(seed: int, compacting: float) -> None:
    served = synthetic_run("run", groups=2, group_size=2, seed=seed, compacting=compacting)
    recorded = as_recorded(served)
    calls = [e for e in recorded if isinstance(e, ModelCall)]
    assert sum(c.extends is not None for c in calls) > 0 or all(c.seq == 0 for c in calls)
    assert whole(calls) == [e for e in served if isinstance(e, ModelCall)]


def test_a_call_extends_the_longest_answer_its_prompt_starts_with() -> None:
    short, long = tip("a", [1, 2], [3], "{}"), tip("b", [1, 2, 3], [4, 5], '{"x": 1}')
    other = tip("c", [9], [9], "{}")
    chosen = extension([short, other, long], [1, 2, 3, 4, 5, 6, 7], '{"x": 1, "y": 2}')
    assert (chosen.extends, chosen.prompt) == ("b", [6, 7])
    assert join_request('{"x": 1}', chosen.request_head, chosen.request_tail, chosen.request) == '{"x": 1, "y": 2}'
    assert extension([other], [1, 2, 3], "{}").extends is None  # starts with none: whole
    assert extension([long], [1, 2, 3], "{}").extends is None  # shorter than the answer


def test_a_call_that_extends_an_unknown_one_cannot_be_made_whole() -> None:
    call = replace(example(ModelCall), extends="never-recorded")
    try:
        Wholes().add(call)
    except MissingCall as exc:
        assert "never-recorded" in str(exc)
    else:
        raise AssertionError("rebuilt a prompt from a call it never saw")


def branching(seed: int) -> list[Event]:
    """One rollout as a harness with n=2 calls, empty answers and failed calls makes it, recorded as deltas."""
    rng = random.Random(seed)
    rid, out, calls = "r", list[Event](), []
    out.append(RolloutStarted(rollout_id=rid, run_id="run", group_id="g", task_id="t", task_json="{}",
                              group_size=1, started_at=T0))
    prompt = [rng.randrange(3, 50) for _ in range(rng.randint(1, 8))]
    for seq in range(rng.randint(1, 6)):
        answers = []
        for choice in range(rng.choice([1, 1, 2])):
            response = [rng.randrange(3, 50) for _ in range(rng.choice([0, 1, 3]))]
            failed = rng.random() < 0.15
            call = replace(example(ModelCall, rollout_id=rid), call_id=f"c{seq}-{choice}", seq=seq,
                           choice_index=choice, prompt_token_ids=list(prompt), response_token_ids=response,
                           response_logprobs=[-0.5] * len(response), status="error" if failed else "ok",
                           request_json=orjson.dumps({"prompt": prompt}).decode(), weight_version=seq)
            calls.append(call)
            if not failed:
                answers.append(call)
        if answers and rng.random() < 0.8:  # carry on from one of the answers, or start over (compaction)
            picked = rng.choice(answers)
            prompt = [*picked.prompt_token_ids, *picked.response_token_ids, *[rng.randrange(3, 50)] * rng.randint(0, 3)]
        else:
            prompt = [*prompt[:1], 7]
    out += calls
    out.append(RolloutSealed(rollout_id=rid, run_id="run", call_ids=[c.call_id for c in calls], sealed_at=T0))
    out.append(RolloutFinished(rollout_id=rid, run_id="run", status="succeeded", duration_s=1, reward=1.0,
                               finished_at=T0))
    return out


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32))
def test_segments_from_recorded_calls_are_the_segments_of_whole_ones(seed: int) -> None:
    served = branching(seed)
    wholes = [call_of(e) for e in served if isinstance(e, ModelCall)]
    deltas = [call_of(e) for e in as_recorded(served) if isinstance(e, ModelCall)]
    assert assemble(deltas) == assemble(wholes)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32), st.integers(0, 30))
def test_recorded_runs_give_the_groups_of_whole_ones_in_any_order(seed: int, duplicates: int) -> None:
    served = synthetic_run("run", groups=3, group_size=3, seed=seed % 1000, failing=0.2, compacting=0.3)
    recorded = as_recorded(served)
    rng = random.Random(seed)
    mixed = [*recorded, *rng.sample(recorded, duplicates)]
    rng.shuffle(mixed)  # a call before the one it extends is held until that one arrives
    reference = rebuild(served, "run", Policy())
    assert len(reference) == 3 and content_hash(rebuild(mixed, "run", Policy())) == content_hash(reference)


def test_a_rollout_whose_call_extends_one_its_seal_does_not_list_is_dropped_with_the_reason() -> None:
    events = as_recorded(synthetic_run("run", groups=1, group_size=2, seed=3, calls=(3, 3)))
    victim = next(e for e in events if isinstance(e, ModelCall) and e.extends is not None)
    events = [replace(e, call_ids=[c for c in e.call_ids if c != victim.extends])
              if isinstance(e, RolloutSealed) and e.rollout_id == victim.rollout_id else e
              for e in events if not (isinstance(e, ModelCall) and e.call_id == victim.extends)]
    for policy in (Policy(), Policy(failed="fill")):
        (group,) = rebuild(events, "run", policy)
        assert not group.partial and len(group.rollouts) == 1  # it counts: the group does not wait for it
        (dropped,) = group.dropped
        assert dropped.rollout_id == victim.rollout_id and dropped.status == "succeeded"
        assert victim.call_id in dropped.reason and victim.extends in dropped.reason  # type: ignore[operator]
