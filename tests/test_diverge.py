"""`tether diverge`: runs built with known divergences of each kind, compared call by call."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from dataclasses import replace
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from repro.diverge import compare, first_divergence, rollouts
from repro.spans import OTHER, changed_spans, classify
from schemas import events as ev
from schemas.producer import EventProducer
from schemas.settings import BusSettings
from tests.factories import T0

SYSTEM = "You are a coding agent."


def started(run: str, task: str, slot: int = 0, attempt: int = 0, seed: int | None = None) -> ev.RolloutStarted:
    return ev.RolloutStarted(rollout_id=f"{run}.{task}.r{slot}.a{attempt}", run_id=run, group_id=f"{run}.{task}",
                             task_id=task, task_json="{}", group_size=2, attempt=attempt,
                             seed=seed if seed is not None else 1000 + slot, started_at=T0)


def call(rollout: ev.RolloutStarted, seq: int, messages: list[dict[str, Any]], tokens: list[int]) -> ev.ModelCall:
    request = {"model": "m", "messages": messages, "max_tokens": 64}
    response = {"id": f"chatcmpl-{uuid.uuid4().hex}", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": " ".join(map(str, tokens))}}]}
    return ev.ModelCall(
        call_id=f"{rollout.rollout_id}-c{seq}", rollout_id=rollout.rollout_id, run_id=rollout.run_id, gateway_id="gw",
        seq=seq, api="openai.chat", model="m", request_json=json.dumps(request), response_json=json.dumps(response),
        prompt_token_ids=[1, 2, 3], response_token_ids=tokens, response_logprobs=[-0.5] * len(tokens),
        weight_version=0, sampling=ev.Sampling(temperature=1.0, top_p=1.0, max_tokens=64, seed=None),
        usage=ev.Usage(prompt_tokens=3, completion_tokens=len(tokens)),
        timings=ev.Timings(received_at=T0, finished_at=T0, queued_ms=0.0, engine_ms=1.0), finish_reason="stop")


def episode(run: str, task: str, results: list[str], answers: list[list[int]], system: str = SYSTEM,
            attempt: int = 0) -> list[Any]:
    """A rollout: the system prompt and task, then per call the model's answer and a tool result."""
    s = started(run, task, attempt=attempt)
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}, {"role": "user", "content": task}]
    out: list[Any] = [s]
    for seq, tokens in enumerate(answers):
        out.append(call(s, seq, list(messages), tokens))
        messages += [{"role": "assistant", "content": " ".join(map(str, tokens))},
                     {"role": "user", "content": results[seq] if seq < len(results) else "ok"}]
    return out


def two_runs() -> tuple[list[Any], list[Any]]:
    """Run A and run B: one rollout per task, each task diverging in its own known way."""
    same = [[5, 6], [7], [8, 9]]
    a = [*episode("A", "same", ["r1", "r2"], same),
         *episode("A", "clock", ["ran at 2026-12-06T10:00:01Z", "x"], same),
         *episode("A", "engine", [], [[5, 6], [7]]),
         *episode("A", "uuid", [], same, system=f"{SYSTEM} Session 6f1c2a9e-0d4b-4c1e-9a7b-2f3e4d5c6b7a."),
         *episode("A", "tmp", ["wrote /tmp/tmpk2j3h4g5/out.txt"], same),
         *episode("A", "duration", ["tests passed in 1.52s"], same),
         *episode("A", "pid", ["server started, pid 4242"], same),
         *episode("A", "longer", ["r1"], [[5], [6]]),
         *episode("A", "retried", ["different"], [[1], [2]], attempt=0),
         *episode("A", "retried", ["r1"], same, attempt=1),
         *episode("A", "words", ["the answer is blue"], same),
         *episode("A", "only-a", [], same)]
    b = [*episode("B", "same", ["r1", "r2"], same),
         *episode("B", "clock", ["ran at 2026-12-06T10:00:07Z", "x"], same),
         *episode("B", "engine", [], [[5, 6], [7, 1]]),
         *episode("B", "uuid", [], same, system=f"{SYSTEM} Session 0a9b8c7d-1e2f-4a3b-8c4d-5e6f7a8b9c0d."),
         *episode("B", "tmp", ["wrote /tmp/tmpq9w8e7r6/out.txt"], same),
         *episode("B", "duration", ["tests passed in 2.03s"], same),
         *episode("B", "pid", ["server started, pid 4343"], same),
         *episode("B", "longer", ["r1"], [[5], [6], [7]]),
         *episode("B", "retried", ["r1"], same),
         *episode("B", "words", ["the answer is green"], same),
         *episode("B", "only-b", [], same)]
    return a, b


def test_each_kind_of_divergence_is_found_at_its_call_on_its_side_and_named() -> None:
    a, b = two_runs()
    result = compare("A", rollouts(a, "A"), "B", rollouts(b, "B"))
    assert result.pairs == 10 and result.only_a == ["A.only-a.r0.a0"] and result.only_b == ["B.only-b.r0.a0"]
    assert result.identical_rollouts == 2  # "same", and "retried" (its latest attempt stands for the slot)
    found = {d.task_id: d for d in result.divergences}
    expected = {"clock": (1, "harness", "timestamp or date"), "engine": (1, "engine", OTHER),
                "uuid": (0, "harness", "random id"), "tmp": (1, "harness", "temporary path"),
                "duration": (1, "harness", "duration"), "pid": (1, "harness", "process id"),
                "longer": (2, "harness", None), "words": (1, "harness", OTHER)}
    assert set(found) == set(expected)
    for task, (index, side, kind) in expected.items():
        d = found[task]
        assert (d.call, d.side) == (index, side), task
        assert [s.kind for s in d.spans] == ([kind] if kind else []), (task, d.spans)
    assert found["clock"].spans[0].a.endswith("10:00:01Z") and found["clock"].spans[0].b.endswith("10:00:07Z")
    assert any(line.startswith("-") and "10:00:01Z" in line for line in found["clock"].diff)
    assert found["longer"].why == "one rollout made 2 calls, the other 3"
    assert result.sides() == {"harness": 7, "engine": 1}
    assert result.first_calls() == {0: 1, 1: 6, 2: 1}
    # calls: per pair the longer side's count (engine: 2, the rest 3); identical where request and tokens agree:
    # same 3, retried 3, longer 2, clock/engine/tmp/duration/pid/words 1 each (their first), uuid none
    assert result.calls == 2 + 9 * 3 and result.identical_calls == 3 + 3 + 2 + 6
    data = result.to_json()
    assert json.loads(json.dumps(data)) == data
    assert data["identical_rollouts_share"] == 0.2 and data["first_diverged"] == {"harness": 7, "engine": 1}


@given(st.lists(st.integers(1, 50), min_size=1, max_size=4), st.text(max_size=30))
def test_a_run_against_itself_is_identical_and_a_comparison_is_symmetric(answer: list[int], note: str) -> None:
    a = episode("A", "t", [note, "x"], [answer, answer, answer])
    b = episode("B", "t", ["other", "x"], [answer, answer])
    same = compare("A", rollouts(a, "A"), "A", rollouts(a, "A"))
    assert same.identical_rollouts == same.pairs == 1 and same.identical_calls == same.calls == 3
    there, back = (first_divergence(rollouts(x, n)[("t", "seed 1000")], rollouts(y, m)[("t", "seed 1000")])
                   for (x, n), (y, m) in (((a, "A"), (b, "B")), ((b, "B"), (a, "A"))))
    assert there is not None and back is not None
    assert (there.call, there.side) == (back.call, back.side)


def test_spans_are_whole_chunks_and_none_where_texts_agree() -> None:
    assert changed_spans("same text", "same text") == []
    spans = changed_spans("started 2026-12-06 12:00:01 in /tmp/tmpab12cd34", "started 2026-12-06 12:00:09 in /tmp/x")
    assert [(s.kind, s.a, s.b) for s in spans] == [("timestamp or date", "12:00:01", "12:00:09"),
                                                    ("temporary path", "/tmp/tmpab12cd34", "/tmp/x")]
    assert classify("call_8f3a9b2c1d4e", "call_0b1c2d3e4f5a") == "random id"
    assert classify("Mon Dec  7", "Tue Dec  8") == "timestamp or date"
    assert classify("blue", "green") == OTHER


def test_the_command_reads_both_runs_from_the_log(bus: BusSettings) -> None:
    """`tether diverge A B --json` over the topics, the calls recorded against their predecessors made whole."""
    tag = uuid.uuid4().hex[:8]
    a, b = (episode(f"{name}-{tag}", "clock", [f"at 2026-12-06T10:00:0{n}Z"], [[5], [6]])
            for n, name in ((1, "a"), (2, "b")))

    async def publish() -> None:
        async with EventProducer(bus) as producer:
            for event in [*a, *b]:
                await producer.publish(event)

    asyncio.run(publish())
    done = subprocess.run(
        [sys.executable, "-m", "tether.cli", "diverge", f"a-{tag}", f"b-{tag}", "--json"], capture_output=True,
        text=True, timeout=240, env={**os.environ, "TETHER_BUS_BOOTSTRAP_SERVERS": bus.bootstrap_servers})
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["pairs"] == 1 and data["identical_calls"] == 1 and data["calls"] == 2
    assert data["first_diverged"] == {"harness": 1} and data["span_classes"] == {"timestamp or date": 1}
    text = subprocess.run(
        [sys.executable, "-m", "tether.cli", "diverge", f"a-{tag}", f"b-{tag}"], capture_output=True, text=True,
        timeout=240, env={**os.environ, "TETHER_BUS_BOOTSTRAP_SERVERS": bus.bootstrap_servers, "COLUMNS": "200"})
    assert text.returncode == 0 and "identical calls" in text.stdout and "1/2 (50%)" in text.stdout, text.stdout


def test_identical_calls_whose_logprobs_moved_are_counted_apart_with_the_largest_drift() -> None:
    """The same request and tokens are an identical call, but the trainer learns from the logprobs too: those
    that differ in any bit are counted apart, and the largest difference is given."""
    a = episode("A", "t", ["r"], [[5, 6], [7]])
    b = episode("B", "t", ["r"], [[5, 6], [7]])
    b[1] = replace(b[1], response_logprobs=[-0.5, -0.5 + 2**-20])  # the first call's second token, last bits
    result = compare("A", rollouts(a, "A"), "B", rollouts(b, "B"))
    assert (result.identical_calls, result.exact_calls) == (2, 1) and result.identical_rollouts == 1
    assert result.max_logprob_drift == 2**-20 and result.to_json()["exact_calls"] == 1


def test_calls_whose_requests_differ_where_the_prompt_tokens_do_not_are_the_same_training_data() -> None:
    """A harness's request can differ in what the template never renders (an item's id): not identical calls, but
    the same prompt and answer tokens, which is what the trainer sees."""
    a = episode("A", "t", ["r"], [[5, 6], [7]])
    b = episode("B", "t", ["r"], [[5, 6], [7]], system=SYSTEM + " ")  # the factory's prompt ids stay [1, 2, 3]
    result = compare("A", rollouts(a, "A"), "B", rollouts(b, "B"))
    assert (result.identical_calls, result.same_tokens_calls, result.calls) == (0, 2, 2)
    b[2] = replace(b[2], prompt_token_ids=[1, 2, 4])
    assert compare("A", rollouts(a, "A"), "B", rollouts(b, "B")).same_tokens_calls == 1
