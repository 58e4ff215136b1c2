"""A restarted gateway, and a second replica, serve rollouts they never saw: the log is their memory."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import httpx
import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.company import Company
from gateway.metrics import Metrics
from gateway.own_writes import OwnWrites
from gateway.peers import PeerWatch
from gateway.readback import fold
from gateway.rollouts import Rollouts
from infra.processes import free_port, stop
from schemas.events import ModelCall, RolloutSealed, RolloutStarted
from schemas.producer import EventProducer
from schemas.settings import BusSettings
from tests.conftest import RunningEngine, RunningGateway, gateway_at, start_gateway
from tests.factories import example
from tests.test_gateway_openai import new_rollout, recorded


def chat(client: openai.OpenAI, messages: list[dict[str, str]], turn: int) -> None:
    """One turn of a harness's episode: the model's answer goes back in the next prompt, as harnesses do."""
    reply = client.chat.completions.create(model="m", messages=messages, max_tokens=6,  # type: ignore[arg-type]
                                           temperature=1.0, seed=turn)
    messages += [{"role": "assistant", "content": reply.choices[0].message.content or ""},
                 {"role": "user", "content": f"and then {turn}?"}]


def seal(gw: RunningGateway, rollout_id: str) -> list[str]:
    r = httpx.post(f"{gw.url}/admin/rollouts/{rollout_id}/seal", headers=gw.admin(), timeout=60)
    r.raise_for_status()
    return list(r.json()["call_ids"])


def assert_one_episode(calls: list[ModelCall], sealed: list[str]) -> None:
    """Unique increasing seqs, every call sealed, and each prompt extending the last with the exact ids the
    model produced (turn reuse held across the failover: no re-tokenisation drift)."""
    calls = sorted(calls, key=lambda c: c.seq)
    assert [c.seq for c in calls] == list(range(len(calls)))
    assert sorted(sealed) == sorted(c.call_id for c in calls) and len(set(sealed)) == len(sealed)
    for before, after in itertools.pairwise(calls):
        grown = before.prompt_token_ids + before.response_token_ids
        assert after.prompt_token_ids[:len(grown)] == grown, f"call {after.seq} does not extend call {before.seq}"


def assert_recorded_as_deltas(events: list[ModelCall | RolloutSealed]) -> None:
    """Every call after the first is recorded against the one before, whichever process served that one: a
    gateway that restored the rollout from the log knows its latest answers as well as the one that served them."""
    calls = sorted((e for e in events if isinstance(e, ModelCall)), key=lambda c: c.seq)
    assert calls[0].extends is None
    assert [c.extends for c in calls[1:]] == [c.call_id for c in calls[:-1]]


async def announce(bus: BusSettings, run_id: str, rollout_id: str) -> None:
    """What the controller publishes before a harness starts."""
    async with EventProducer(bus) as producer:
        await producer.publish(RolloutStarted(rollout_id=rollout_id, run_id=run_id, group_id="g", task_id="t",
                                              task_json="{}", group_size=1))


def test_a_gateway_killed_mid_episode_serves_the_rollout_again(
        bus: BusSettings, engine_server: RunningEngine, tiny_model: Path, tmp_path: Path) -> None:
    port, run_id = free_port(), f"restart-{time.monotonic_ns()}"
    gw = gateway_at(port, bus, engine_server, tiny_model, tmp_path / "gw-1.log", run_id)
    try:
        rollout_id, token = new_rollout(gw)
        client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=token, max_retries=0)
        messages = [{"role": "user", "content": "Count with me."}]
        for turn in range(3):
            chat(client, messages, turn)
        gw.process.kill()  # SIGKILL: nothing is written on the way out
        gw.process.wait()
        started = time.monotonic()
        gw = gateway_at(port, bus, engine_server, tiny_model, tmp_path / "gw-2.log", run_id)
        print(f"gateway back in {time.monotonic() - started:.1f} s")
        for turn in range(3, 5):
            chat(client, messages, turn)
        sealed = seal(gw, rollout_id)
    finally:
        stop(gw.process)
    events = asyncio.run(recorded(bus, rollout_id, 6))
    assert_one_episode([e for e in events if isinstance(e, ModelCall)], sealed)
    assert_recorded_as_deltas(asyncio.run(recorded(bus, rollout_id, 6, whole=False)))
    assert [e.call_ids for e in events if isinstance(e, RolloutSealed)] == [sealed]
    assert "restored rollout" in (tmp_path / "gw-2.log").read_text()


@contextmanager
def two_replicas(bus: BusSettings, engine: RunningEngine, tiny_model: Path, tmp_path: Path
                 ) -> Iterator[tuple[RunningGateway, RunningGateway, str, str]]:
    """Replicas a and b of one run, and a rollout registered on a and announced as the controller does."""
    run_id = f"replicas-{time.monotonic_ns()}"
    a = start_gateway(bus, engine, tiny_model, tmp_path / "a.log", run_id)
    b = start_gateway(bus, engine, tiny_model, tmp_path / "b.log", run_id)
    try:
        rollout_id, token = new_rollout(a)
        asyncio.run(announce(bus, run_id, rollout_id))
        yield a, b, rollout_id, token
    finally:
        stop(a.process)
        stop(b.process)


def test_a_rollout_moves_between_two_replicas_and_back(
        bus: BusSettings, engine_server: RunningEngine, tiny_model: Path, tmp_path: Path) -> None:
    with two_replicas(bus, engine_server, tiny_model, tmp_path) as (a, b, rollout_id, token):
        clients = {gw: openai.OpenAI(base_url=f"{gw.url}/v1", api_key=token, max_retries=0) for gw in (a, b)}
        messages = [{"role": "user", "content": "Count with me."}]
        for turn, gw in enumerate([a, a, b, b, a, b]):
            if turn in (4, 5):  # back on a replica that served it: it must have noticed the other's calls
                wait_until_forgotten(gw)  # before serving from its memory (the window is the watcher's lag)
            chat(clients[gw], messages, turn)
        sealed = seal(a, rollout_id)  # sealed where it started: b's calls are listed all the same
        assert seal(b, rollout_id) == sealed  # and sealed on every replica
        with pytest.raises(openai.ConflictError):
            clients[b].chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=2)
    events = asyncio.run(recorded(bus, rollout_id, 7))
    calls = [e for e in events if isinstance(e, ModelCall)]
    assert_one_episode(calls, sealed)
    assert len({c.gateway_id for c in calls}) == 2
    assert_recorded_as_deltas(asyncio.run(recorded(bus, rollout_id, 7, whole=False)))


def wait_until_forgotten(gw: RunningGateway, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        metrics = httpx.get(f"{gw.url}/metrics").text
        if any(line.startswith("tether_gateway_forgotten_rollouts_total") and not line.endswith(" 0.0")
               for line in metrics.splitlines()):
            return
        time.sleep(0.05)
    raise AssertionError("the replica did not notice the other's calls")


def test_a_replica_that_never_saw_the_rollout_serves_its_first_call(
        bus: BusSettings, engine_server: RunningEngine, tiny_model: Path, tmp_path: Path) -> None:
    with two_replicas(bus, engine_server, tiny_model, tmp_path) as (a, b, rollout_id, token):
        # registered on a only, as a load balancer would leave it
        chat(openai.OpenAI(base_url=f"{b.url}/v1", api_key=token, max_retries=0),
             [{"role": "user", "content": "hi"}], 0)
        reward = httpx.post(f"{a.url}/rollouts/{rollout_id}/reward", json={"reward": 1.0},
                            headers={"authorization": f"Bearer {token}"})
        assert reward.status_code == 200
        assert len(seal(a, rollout_id)) == 1


def peer_watch(gw: RunningGateway) -> float:
    """1 while the gateway follows tether.calls for the other replicas' writes, 0 while it is alone."""
    for line in httpx.get(f"{gw.url}/metrics", timeout=5).text.splitlines():
        if line.startswith("tether_gateway_peer_watch "):
            return float(line.split()[-1])
    raise AssertionError("no tether_gateway_peer_watch in /metrics")


def wait_for_watch(gw: RunningGateway, value: float, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while peer_watch(gw) != value:
        assert time.monotonic() < deadline, f"the peer watch stayed at {peer_watch(gw)}, not {value}"
        time.sleep(0.05)


def test_a_lone_replica_reads_the_calls_once_a_second_and_follows_them_once_another_joins(
        bus: BusSettings, engine_server: RunningEngine, tiny_model: Path, tmp_path: Path) -> None:
    """Alone it reads tether.calls once a second; the second replica serves a call right after it starts, and the
    first reads that call and forgets the rollout before its next call; once the other leaves, it reads once a
    second again."""
    run_id = f"alone-{time.monotonic_ns()}"
    a = start_gateway(bus, engine_server, tiny_model, tmp_path / "a.log", run_id)
    try:
        wait_for_watch(a, 0)
        rollout_id, token = new_rollout(a)
        asyncio.run(announce(bus, run_id, rollout_id))
        messages = [{"role": "user", "content": "Count with me."}]
        on_a = openai.OpenAI(base_url=f"{a.url}/v1", api_key=token, max_retries=0)
        for turn in range(2):
            chat(on_a, messages, turn)
        b = start_gateway(bus, engine_server, tiny_model, tmp_path / "b.log", run_id)
        try:
            chat(openai.OpenAI(base_url=f"{b.url}/v1", api_key=token, max_retries=0), messages, 2)
            wait_until_forgotten(a)
            assert peer_watch(a) == 1
            chat(on_a, messages, 3)
        finally:
            stop(b.process)  # SIGTERM: it says GatewayLeft on its way out
        wait_for_watch(a, 0)
        chat(on_a, messages, 4)
        sealed = seal(a, rollout_id)
    finally:
        stop(a.process)
    calls = [e for e in asyncio.run(recorded(bus, rollout_id, 6)) if isinstance(e, ModelCall)]
    assert_one_episode(calls, sealed)
    assert [c.gateway_id for c in calls].count(calls[2].gateway_id) == 1  # only call 2 was served by b
    assert "no other gateway of the run is alive" in (tmp_path / "a.log").read_text()


async def test_a_lone_watcher_still_reads_every_call_and_follows_as_written_once_another_joins(
        bus: BusSettings, producer: EventProducer) -> None:
    """Alone, the watcher reads tether.calls once a second instead of as written: a call by a gateway that never
    said it joined (its control loop dead, say) is still read within that second; once another joins it follows
    again, and reads the next call as it is written."""
    rollouts, metrics, company = Rollouts(), Metrics(), Company("a", lease_s=30.0)
    first, second = f"lone-{time.monotonic_ns()}", f"lone-{time.monotonic_ns()}-2"
    for rollout_id in (first, second):
        rollouts.register(rollout_id, "run")
    watch = PeerWatch(bus=bus, gateway_id="a", rollouts=rollouts, own=OwnWrites(), producer=producer,
                      metrics=metrics, company=company)
    task = asyncio.create_task(watch.run())
    watching = lambda: metrics.registry.get_sample_value("tether_gateway_peer_watch")  # noqa: E731
    try:
        await asyncio.wait_for(watch.ready.wait(), 60)
        company.history_read()  # the control log read: nobody else
        await until(lambda: watching() == 0)
        await producer.publish(replace(call(first, 0, "b"), run_id="run"))  # b never joined
        started = time.monotonic()
        await until(lambda: rollouts.find(first) is None, timeout_s=10)
        assert time.monotonic() - started < 1 + 2  # its next read, give or take a slow machine
        assert watching() == 0
        company.joined("b", time.time(), now=time.time())
        await until(lambda: watching() == 1)
        await producer.publish(replace(call(second, 0, "b"), run_id="run"))
        started = time.monotonic()
        await until(lambda: rollouts.find(second) is None, timeout_s=10)
        assert time.monotonic() - started < 0.5  # as written
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def until(condition: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "not within the time allowed"
        await asyncio.sleep(0.05)


# -- the fold, pure ---------------------------------------------------------------------------------------


def call(rid: str, seq: int, gateway: str, ok: bool = True, key: str | None = "k") -> ModelCall:
    return replace(example(ModelCall, run_id="run", rollout_id=rid), call_id=f"{rid}-{gateway}-{seq}", seq=seq,
                   gateway_id=gateway, status="ok" if ok else "error", turn_key=key if ok else None,
                   response_token_ids=[seq, seq + 1], response_logprobs=[-0.5, -0.5])


@given(st.lists(st.tuples(st.sampled_from(["a", "b"]), st.booleans()), max_size=12), st.booleans())
def test_the_fold_gives_the_next_seq_the_calls_and_the_turns(history: list[tuple[str, bool]],
                                                             sealed: bool) -> None:
    calls = [call("r", seq, gw, ok) for seq, (gw, ok) in enumerate(history)]
    others = [call("other", 0, "a")]
    seal_event = [RolloutSealed(rollout_id="r", run_id="run", call_ids=[c.call_id for c in calls[:2]])]
    late = [call("r", len(calls), "a")]  # stored after the seal: not part of the rollout
    state = fold("r", [*others, *calls, *(seal_event + late if sealed else [])])
    if not calls and not sealed:
        assert state is None
        return
    assert state is not None and state.run_id == "run"
    if sealed:
        assert state.sealed and state.acknowledged == [c.call_id for c in calls[:2]]
    else:
        assert not state.sealed and state.acknowledged == [c.call_id for c in calls]
        assert state.next_seq == len(calls)
        assert state.turns == [("k", [c.seq, c.seq + 1]) for c in calls if c.status == "ok"]
        # the latest answers are what the next call's record may extend
        assert [t.call_id for t in state.tips] == [c.call_id for c in calls if c.status == "ok"][-4:]
    # what a seal reads: the same calls, seqs and seal, without making each call whole again
    ids_only = fold("r", [*others, *calls, *(seal_event + late if sealed else [])], whole=False)
    assert ids_only is not None
    assert (ids_only.acknowledged, ids_only.next_seq, ids_only.sealed) == (state.acknowledged, state.next_seq,
                                                                          state.sealed)


def test_own_writes_are_recognised_once_and_bounded() -> None:
    own = OwnWrites(limit=3)
    for offset in range(5):
        own.add(0, offset)
    assert [own.pop(0, o) for o in range(5)] == [False, False, True, True, True]  # the oldest aged out
    assert not own.pop(0, 4)  # each record is read once
