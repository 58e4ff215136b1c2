"""`tether up` under load: a gateway replica lost behind HAProxy, or the single gateway or the engine killed and
restarted by its supervisor, fails no harness that uses its SDK's default retries."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import openai
from typer.testing import CliRunner

from infra.kafka.launcher import KafkaBroker
from infra.processes import free_port, free_port_block
from schemas.events import ModelCall, RolloutSealed, RolloutStarted
from schemas.producer import EventProducer
from schemas.rollout_token import mint
from schemas.settings import BusSettings
from tests.test_gateway_openai import recorded
from tether.cli import app
from tether.stack import Stack, StackSettings

ROLLOUTS, TURNS = 8, 8


def episode(base_url: str, token: str, errors: list[BaseException]) -> None:
    """A harness as shipped: the SDK's own retries (two), a call every few tenths of a second."""
    client = openai.OpenAI(base_url=base_url, api_key=token)  # default max_retries=2
    messages: list[dict[str, str]] = [{"role": "user", "content": "Count with me."}]
    try:
        for turn in range(TURNS):
            reply = client.chat.completions.create(model="m", messages=messages, max_tokens=4)  # type: ignore[arg-type]
            messages += [{"role": "assistant", "content": reply.choices[0].message.content or ""},
                         {"role": "user", "content": f"and {turn}?"}]
            time.sleep(0.3)
    except BaseException as exc:  # whatever ended a harness is reported
        errors.append(exc)


async def announce(bus: BusSettings, run_id: str, rollout_ids: list[str]) -> None:
    async with EventProducer(bus) as producer:
        await producer.publish_many([RolloutStarted(rollout_id=r, run_id=run_id, group_id=r, task_id=r,
                                                    task_json="{}", group_size=1) for r in rollout_ids])


def kill_under_load(broker: KafkaBroker, bus: BusSettings, settings: StackSettings,
                    kill: Callable[[Stack], None]) -> Stack:
    """ROLLOUTS harnesses with the SDK's default retries against the stack; `kill` strikes 1.5 s in. Every
    harness must finish, and every rollout's calls be on the log once, in order, and sealed."""
    stack = Stack(settings, broker=broker)
    admin = {"authorization": f"Bearer {settings.admin_key}"}
    rollout_ids = [f"{settings.run_id}-r{i}" for i in range(ROLLOUTS)]
    try:
        stack.up()
        for rid in rollout_ids:  # as the controller does: register (through the balancer), then announce
            httpx.post(f"{settings.gateway_url}/admin/rollouts", json={"rollout_id": rid, "run_id": settings.run_id},
                       headers=admin).raise_for_status()
        asyncio.run(announce(bus, settings.run_id, rollout_ids))
        errors: list[BaseException] = []
        harnesses = [threading.Thread(target=episode, args=(f"{settings.gateway_url}/v1",
                                                            mint(rid, settings.secret), errors))
                     for rid in rollout_ids]
        for h in harnesses:
            h.start()
        time.sleep(1.5)
        kill(stack)
        for h in harnesses:
            h.join(120)
        assert not errors, f"{len(errors)} harnesses failed: {errors[:3]}"
        sealed = {rid: httpx.post(f"{settings.gateway_url}/admin/rollouts/{rid}/seal", headers=admin,
                                  timeout=60).json()["call_ids"] for rid in rollout_ids}
    finally:
        stack.down(keep_kafka=True)
    for rid in rollout_ids:
        events = asyncio.run(recorded(bus, rid, len(sealed[rid]) + 1))
        calls = sorted((e for e in events if isinstance(e, ModelCall)), key=lambda c: c.seq)
        assert [c.seq for c in calls] == list(range(len(calls))), f"{rid}: seqs {[c.seq for c in calls]}"
        assert len(calls) >= TURNS and sorted(sealed[rid]) == sorted(c.call_id for c in calls)
        assert any(isinstance(e, RolloutSealed) for e in events)
    return stack


def stack_settings(tmp_path: Path, tiny_model: Path, replicas: int) -> StackSettings:
    run_id = f"replicas-{os.getpid()}-{time.monotonic_ns() % 10**6}"
    return StackSettings(run_id=run_id, home=tmp_path / "home", model=tiny_model, engine_port=free_port(),
                         gateway_port=free_port_block(replicas + 1), gateway_replicas=replicas, with_trainer=False)


def kill_server(stack: Stack, service: str) -> int:
    """SIGKILL the server a supervised service runs now (not its supervisor); its pid."""
    victim = stack.server_pid(service)
    assert victim is not None and victim != stack.pid(service)
    os.kill(victim, signal.SIGKILL)
    return victim


def test_a_replica_killed_under_load_fails_no_rollout(broker: KafkaBroker, bus: BusSettings, tiny_model: Path,
                                                      tmp_path: Path) -> None:
    """The replica's supervisor and server both SIGKILLed (a lost node): HAProxy sends its rollouts elsewhere."""
    def lose_gateway_1(stack: Stack) -> None:
        victim = stack.pid("gateway-1")
        assert victim is not None
        os.kill(victim, signal.SIGKILL)  # its server dies with it (PR_SET_PDEATHSIG)

    stack = kill_under_load(broker, bus, stack_settings(tmp_path, tiny_model, 2), lose_gateway_1)
    assert "restored rollout" in (stack.logs / "gateway-2.log").read_text()  # it took over the victim's


def test_the_single_gateway_killed_under_load_fails_no_harness(broker: KafkaBroker, bus: BusSettings,
                                                               tiny_model: Path, tmp_path: Path) -> None:
    """`tether up`'s default, one gateway, its server SIGKILLed mid-episode: the supervisor starts it again on the
    socket it holds, the harnesses' calls wait in the listen backlog meanwhile, and the SDKs' default retries
    (about 1.5 s, shorter than a start) are never exhausted."""
    killed: list[int] = []

    def kill_the_server(stack: Stack) -> None:
        status = CliRunner().invoke(app, ["status"], env={"TETHER_STACK_HOME": str(stack.settings.home),
                                                          "COLUMNS": "300"})
        assert f"stack of run {stack.settings.run_id}" in status.output  # the run that runs, from any shell
        assert str(stack.pid("gateway")) in status.output, status.output
        killed.append(kill_server(stack, "gateway"))

    stack = kill_under_load(broker, bus, stack_settings(tmp_path, tiny_model, 1), kill_the_server)
    log = (stack.logs / "gateway.log").read_text()
    assert f"server (pid {killed[0]}) exited with signal SIGKILL" in log and "restart 1 " in log, log[-3000:]
    assert "restored rollout" in log  # the new process read the live rollouts back from the log


def test_the_engine_killed_under_load_fails_no_harness(broker: KafkaBroker, bus: BusSettings, tiny_model: Path,
                                                       tmp_path: Path) -> None:
    """The engine's server SIGKILLed: its supervisor starts it again on the port it holds, and the gateway's
    requests (retried on the cut ones) wait in its backlog meanwhile; no call fails, no harness sees it."""
    killed: list[int] = []
    stack = kill_under_load(broker, bus, stack_settings(tmp_path, tiny_model, 1),
                            lambda stack: killed.append(kill_server(stack, "engine")))
    log = (stack.logs / "engine.log").read_text()
    assert f"server (pid {killed[0]}) exited with signal SIGKILL" in log and log.count("ready in") == 2, log[-3000:]
