"""Events for tests: one fixed example of every type, and hypothesis strategies for all of them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TypeVar

from hypothesis import strategies as st

from schemas import events as ev
from schemas.events import ROLLOUT_STATUSES, Event

E = TypeVar("E", bound=Event)
T0 = datetime(2026, 11, 30, 12, 0, 0, 123456, tzinfo=UTC)


def examples(run_id: str = "run-1", rollout_id: str = "r-1") -> list[Event]:
    """One realistic event of each type, all about one run."""
    timings = ev.Timings(received_at=T0, finished_at=T0, queued_ms=1.5, engine_ms=42.0)
    segment = ev.Segment(token_ids=[1, 2, 3], loss_mask=[False, True, True], logprobs=[0.0, -0.5, -0.25],
                         weight_versions=[-1, 3, 3], spans=[ev.CallSpan(seq=0, start=1, end=3)])
    return [
        ev.RolloutStarted(rollout_id=rollout_id, run_id=run_id, group_id="g-1", task_id="t-1",
                          task_json='{"q": "2+2"}', group_size=4, seed=2**62 + 7, started_at=T0),
        ev.ModelCall(call_id=f"{rollout_id}-c0", rollout_id=rollout_id, run_id=run_id, gateway_id="gw-0", seq=0,
                     api="openai.chat", model="tiny", request_json='{"messages": []}',
                     response_json='{"choices": []}', prompt_token_ids=[5, 6, 7], response_token_ids=[8, 9],
                     response_logprobs=[-0.5, -1.25], weight_version=3,
                     sampling=ev.Sampling(temperature=1.0, top_p=1.0, max_tokens=64, seed=None),
                     usage=ev.Usage(prompt_tokens=3, completion_tokens=2), timings=timings, finish_reason="stop",
                     turn_key="5f2b9c"),
        ev.RolloutSealed(rollout_id=rollout_id, run_id=run_id, call_ids=[f"{rollout_id}-c0"], sealed_at=T0),
        ev.RewardReported(rollout_id=rollout_id, run_id=run_id, reward=1.0, source="harness", reported_at=T0),
        ev.RolloutFinished(rollout_id=rollout_id, run_id=run_id, status="succeeded", duration_s=2.5, exit_code=0,
                           reward=1.0, finished_at=T0),
        ev.TaskGroup(group_id="g-1", run_id=run_id, task_id="t-1", group_size=2, created_at=T0,
                     rollouts=[ev.RolloutSample(rollout_id=rollout_id, reward=1.0, status="succeeded",
                                                segments=[segment], step_rewards=[ev.StepReward(seq=0, reward=0.5)])],
                     dropped=[ev.DroppedRollout(rollout_id="r-2", status="timeout", reason="harness timed out")]),
        ev.UpdateRequested(run_id=run_id, version=4, n_task_groups=8, requested_at=T0),
        ev.GatewayDrained(run_id=run_id, version=4, gateway_id="gw-0", held_calls=2, drained_at=T0),
        ev.WeightVersionPublished(run_id=run_id, version=4, checkpoint_path="/ckpt/4", published_at=T0),
        ev.UpdateAborted(run_id=run_id, version=5, reason="drain timed out after 60s", aborted_at=T0),
        ev.GatewayJoined(run_id=run_id, gateway_id="gw-0", url="http://127.0.0.1:8000", joined_at=T0),
        ev.GatewayLeft(run_id=run_id, gateway_id="gw-0", reason="shut down", left_at=T0),
        ev.TrainerStep(run_id=run_id, version=4, task_groups=8, tokens=12_345, mean_reward=0.5, loss=-0.01,
                       entropy=1.5, clip_fraction=0.02, kl=0.001, grad_norm=0.7, staleness_mean=0.4,
                       staleness_max=2.0, dropped_stale=1, dropped_no_signal=2, seconds=3.5, stepped_at=T0,
                       advantages=[ev.RolloutAdvantage(group_id="g-1", rollout_id="r-1", advantage=0.7),
                                   ev.RolloutAdvantage(group_id="g-1", rollout_id="r-2", advantage=-0.7, calls=[
                                       ev.CallAdvantage(seq=0, advantage=-0.2),
                                       ev.CallAdvantage(seq=1, advantage=-1.1)])]),
        ev.ValidationStarted(run_id=run_id, version=4, rollouts=24, started_at=T0),
        ev.ValidationReported(run_id=run_id, version=4, seconds=31.5, reported_at=T0, scores=[
            ev.ValidationScore(setting="greedy", temperature=0.0, rollouts=12, mean_reward=0.75, unrewarded=1,
                               duration_s=2.5),
            ev.ValidationScore(setting="harness", rollouts=12, mean_reward=0.5)]),
        ev.DeadLetter(topic="tether.calls", partition=3, offset=17, key=b"r-1", value=b"\x00garbage",
                      reason="not an Avro single-object record", error_type="NotSingleObject", consumer="test",
                      dead_at=T0),
    ]


def example(cls: type[E], run_id: str = "run-1", rollout_id: str = "r-1") -> E:
    """The example of one type, typed as that type."""
    (event,) = [e for e in examples(run_id, rollout_id) if isinstance(e, cls)]
    return event


# -- strategies ---------------------------------------------------------------

ids = st.text(min_size=1, max_size=40)
texts = st.text(max_size=200)
int32 = st.integers(-(2**31), 2**31 - 1)
nat32 = st.integers(0, 2**31 - 1)
int64 = st.integers(-(2**63), 2**63 - 1)
nat64 = st.integers(0, 2**63 - 1)
doubles = st.floats(allow_nan=False)
finite = st.floats(allow_nan=False, allow_infinity=False)
float32s = st.floats(allow_nan=False, width=32)
token_ids = st.lists(nat32, max_size=300)
stamps = st.datetimes(min_value=datetime(1900, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC))
statuses = st.sampled_from(sorted(ROLLOUT_STATUSES))
#: Large payloads without generating a megabyte character by character.
near_megabyte = st.tuples(st.characters(exclude_categories=["Cs"]),  # text is UTF-8: no lone surrogates
                          st.integers(900_000, 1_000_000)).map(lambda t: t[0] * t[1])


@st.composite
def model_calls(draw: st.DrawFn, big: bool = False) -> ev.ModelCall:
    n = draw(st.integers(0, 300))
    return ev.ModelCall(
        call_id=draw(ids), rollout_id=draw(ids), run_id=draw(ids), gateway_id=draw(ids), seq=draw(nat32),
        choice_index=draw(nat32), api=draw(texts),
        model=draw(texts), request_json=draw(near_megabyte if big else texts), response_json=draw(texts),
        prompt_token_ids=draw(token_ids), response_token_ids=draw(st.lists(nat32, min_size=n, max_size=n)),
        response_logprobs=draw(st.lists(float32s, min_size=n, max_size=n)), weight_version=draw(nat64),
        sampling=ev.Sampling(temperature=draw(doubles), top_p=draw(doubles), max_tokens=draw(int32),
                             seed=draw(st.none() | int64)),
        usage=ev.Usage(prompt_tokens=draw(int32), completion_tokens=draw(int32)),
        timings=ev.Timings(received_at=draw(stamps), finished_at=draw(stamps), queued_ms=draw(doubles),
                           engine_ms=draw(doubles)),
        status=draw(st.sampled_from(["ok", "error"])), http_status=draw(int32),
        finish_reason=draw(st.none() | texts), error=draw(st.none() | texts), turn_key=draw(st.none() | texts),
    )


@st.composite
def segments(draw: st.DrawFn) -> ev.Segment:
    n = draw(st.integers(0, 200))
    return ev.Segment(
        token_ids=draw(st.lists(nat32, min_size=n, max_size=n)),
        loss_mask=draw(st.lists(st.booleans(), min_size=n, max_size=n)),
        logprobs=draw(st.lists(float32s, min_size=n, max_size=n)),
        weight_versions=draw(st.lists(int64, min_size=n, max_size=n)),
    )


@st.composite
def task_groups(draw: st.DrawFn) -> ev.TaskGroup:
    rollouts = draw(st.lists(st.builds(ev.RolloutSample, rollout_id=ids, reward=finite, status=statuses,
                                       segments=st.lists(segments(), max_size=3), filled=st.booleans()),
                             max_size=4))
    dropped = draw(st.lists(st.builds(ev.DroppedRollout, rollout_id=ids, status=statuses, reason=texts), max_size=2))
    return ev.TaskGroup(group_id=draw(ids), run_id=draw(ids), task_id=draw(ids),
                        group_size=max(1, len(rollouts) + len(dropped)) + draw(st.integers(0, 3)),
                        rollouts=rollouts, dropped=dropped, partial=draw(st.booleans()), created_at=draw(stamps))


STRATEGIES: dict[type, st.SearchStrategy[Event]] = {
    ev.ModelCall: model_calls(),
    ev.RolloutSealed: st.builds(ev.RolloutSealed, rollout_id=ids, run_id=ids,
                                call_ids=st.lists(ids, unique=True, max_size=50), sealed_at=stamps),
    ev.RolloutStarted: st.builds(ev.RolloutStarted, rollout_id=ids, run_id=ids, group_id=ids, task_id=ids,
                                 task_json=texts, group_size=st.integers(1, 2**31 - 1), runner=texts,
                                 attempt=nat32, retry_of=st.none() | ids, weight_version=int64,
                                 validation=st.booleans(), temperature=st.none() | st.floats(0, 2),
                                 seed=st.none() | st.integers(0, 2**63 - 1), started_at=stamps),
    ev.RewardReported: st.builds(ev.RewardReported, rollout_id=ids, run_id=ids, reward=finite, source=ids,
                                 details_json=st.none() | texts, reported_at=stamps),
    ev.RolloutFinished: st.builds(ev.RolloutFinished, rollout_id=ids, run_id=ids, status=statuses,
                                  duration_s=st.floats(min_value=0, allow_nan=False), exit_code=st.none() | int32,
                                  reward=st.none() | finite, reason=st.none() | texts, finished_at=stamps),
    ev.TaskGroup: task_groups(),
    ev.UpdateRequested: st.builds(ev.UpdateRequested, run_id=ids, version=st.integers(1, 2**63 - 1),
                                  n_task_groups=int32, requested_at=stamps),
    ev.GatewayDrained: st.builds(ev.GatewayDrained, run_id=ids, version=int64, gateway_id=ids, held_calls=int32,
                                 drained_at=stamps),
    ev.WeightVersionPublished: st.builds(ev.WeightVersionPublished, run_id=ids, version=nat64,
                                         checkpoint_path=st.none() | texts, final=st.booleans(), adapter=st.booleans(),
                                         published_at=stamps),
    ev.UpdateAborted: st.builds(ev.UpdateAborted, run_id=ids, version=int64, reason=texts, aborted_at=stamps),
    ev.GatewayJoined: st.builds(ev.GatewayJoined, run_id=ids, gateway_id=ids, url=texts, joined_at=stamps),
    ev.GatewayLeft: st.builds(ev.GatewayLeft, run_id=ids, gateway_id=ids, reason=texts, left_at=stamps),
    ev.TrainerStep: st.builds(ev.TrainerStep, run_id=ids, version=st.integers(1, 2**63 - 1), task_groups=int32,
                              tokens=int64, mean_reward=doubles, loss=doubles, entropy=doubles,
                              clip_fraction=doubles, kl=doubles, grad_norm=doubles, staleness_mean=doubles,
                              staleness_max=doubles, dropped_stale=int32, dropped_no_signal=int32, seconds=doubles,
                              advantages=st.lists(st.builds(
                                  ev.RolloutAdvantage, group_id=ids, rollout_id=ids, advantage=doubles,
                                  calls=st.lists(st.builds(ev.CallAdvantage, seq=int32, advantage=doubles),
                                                 max_size=3)), max_size=3),
                              stepped_at=stamps),
    ev.ValidationStarted: st.builds(ev.ValidationStarted, run_id=ids, version=nat64, rollouts=nat32,
                                    started_at=stamps),
    ev.ValidationReported: st.builds(ev.ValidationReported, run_id=ids, version=nat64, seconds=doubles,
                                     reported_at=stamps, scores=st.lists(st.builds(
                                         ev.ValidationScore, setting=ids, temperature=st.none() | st.floats(0, 2),
                                         rollouts=nat32, mean_reward=finite, unrewarded=nat32,
                                         duration_s=doubles), max_size=3)),
    ev.DeadLetter: st.builds(ev.DeadLetter, topic=texts, partition=int32, offset=int64, reason=texts,
                             error_type=texts, consumer=texts, key=st.none() | st.binary(),
                             value=st.none() | st.binary(max_size=2000), dead_at=stamps),
}


def synthetic_run(run_id: str, groups: int, group_size: int, calls: tuple[int, int] = (2, 5), seed: int = 0,
                  prompt_tokens: int = 300, response_tokens: int = 60, failing: float = 0.0,
                  compacting: float = 0.0, vocab: int = 2000, deltas: bool = False) -> list[Event]:
    """A run's events as gateway and controller write them: multi-call rollouts whose prompts extend each other
    (or restart, for a compacting harness), seal, reward, finish. In production order, per rollout. Calls are
    whole, or with `deltas` recorded against the calls they extend, as the gateway records them."""
    import json
    import random

    rng = random.Random(seed)
    out: list[Event] = []
    timings = ev.Timings(received_at=T0, finished_at=T0, queued_ms=0.1, engine_ms=5.0)
    for g in range(groups):
        gid = f"{run_id}.task{g}"
        for k in range(group_size):
            rid = f"{gid}.r{k}.a0"
            out.append(ev.RolloutStarted(rollout_id=rid, run_id=run_id, group_id=gid, task_id=f"task{g}",
                                         task_json="{}", group_size=group_size, started_at=T0))
            prompt = [rng.randrange(3, vocab) for _ in range(prompt_tokens)]
            call_ids = []
            for seq in range(rng.randint(*calls)):
                if seq and rng.random() < compacting:
                    prompt = prompt[:prompt_tokens // 2]  # the harness summarised its context
                response = [rng.randrange(3, vocab) for _ in range(rng.randint(1, response_tokens))]
                cid = f"{rid}-c{seq}"
                call_ids.append(cid)
                messages = [{"role": "user", "content": " ".join(map(str, prompt[i:i + 40]))}
                            for i in range(0, len(prompt), 40)]
                out.append(ev.ModelCall(
                    call_id=cid, rollout_id=rid, run_id=run_id, gateway_id="gw", seq=seq, api="openai.chat",
                    model="tiny", request_json=json.dumps({"model": "tiny", "messages": messages, "max_tokens": 64}),
                    response_json="{}", prompt_token_ids=list(prompt),
                    response_token_ids=response, response_logprobs=[-rng.random() for _ in response],
                    weight_version=g // 4, sampling=ev.Sampling(temperature=1.0, top_p=1.0, max_tokens=64, seed=None),
                    usage=ev.Usage(prompt_tokens=len(prompt), completion_tokens=len(response)), timings=timings))
                prompt = prompt + response + [rng.randrange(3, vocab) for _ in range(20)]
            out.append(ev.RolloutSealed(rollout_id=rid, run_id=run_id, call_ids=call_ids, sealed_at=T0))
            failed = rng.random() < failing
            reward = None if failed else float(rng.random() < 0.5)
            out.append(ev.RolloutFinished(rollout_id=rid, run_id=run_id, status="failed" if failed else "succeeded",
                                          duration_s=1.0, exit_code=1 if failed else 0, reward=reward,
                                          finished_at=T0.replace(second=g % 60)))
    return as_recorded(out) if deltas else out


def as_recorded(events: list[Event], tips: int = 4) -> list[Event]:
    """The events with every call recorded as the gateway records it: against the longest of its rollout's latest
    `tips` answers that its prompt extends (gateway.extends), whole if none."""
    from collections import deque
    from dataclasses import replace

    from gateway.extends import Tip, extension, tip

    latest: dict[str, deque[Tip]] = {}
    out: list[Event] = []
    for e in events:
        if not isinstance(e, ev.ModelCall):
            out.append(e)
            continue
        answers = latest.setdefault(e.rollout_id, deque(maxlen=tips))
        x = extension(answers, e.prompt_token_ids, e.request_json)
        out.append(replace(e, prompt_token_ids=x.prompt, extends=x.extends, request_head=x.request_head,
                           request_tail=x.request_tail, request_json=x.request))
        if e.status == "ok":
            answers.append(tip(e.call_id, e.prompt_token_ids, e.response_token_ids, e.request_json))
    return out
