"""The trainer against the real broker: the pause→drain→update→resume handshake with a real gateway and engine,
validation rounds between updates, gateways joining and lost, and a trainer killed mid-run that resumes without
training a group twice or skipping one. The hand-over of versions to engines: test_trainer_handover.py."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import httpx
import pytest
import yaml

from schemas import topics
from schemas.consumer import EventConsumer
from schemas.events import (
    Event,
    GatewayDrained,
    GatewayJoined,
    GatewayLeft,
    ModelCall,
    TaskGroup,
    TrainerStep,
    UpdateAborted,
    UpdateRequested,
    ValidationReported,
    ValidationScore,
    ValidationStarted,
    WeightVersionPublished,
    run_of,
)
from schemas.producer import EventProducer
from schemas.settings import BusSettings
from stream_processors.grouping import Policy
from stream_processors.pipeline import rebuild
from tests.conftest import RunningEngine, gateway
from tests.factories import synthetic_run
from tests.test_trainer_tracking import NAMES, tensorboard_scalars
from trainer import checkpoint
from trainer.config import TrainerConfig, load_config
from trainer.errors import ConfigError
from trainer.loop import Control, Trainer


def task_groups(run_id: str, n: int, seed: int = 0, prompt_tokens: int = 40) -> list[TaskGroup]:
    groups = rebuild(synthetic_run(run_id, groups=n, group_size=4, seed=seed, calls=(1, 3), prompt_tokens=prompt_tokens,
                                   response_tokens=12, vocab=1000), run_id, Policy())  # the tiny model has 1,043
    assert len(groups) == n
    return groups


async def control_events(bus: BusSettings, run_id: str) -> list[Event]:
    async with EventProducer(bus) as dlq, EventConsumer(bus, [topics.CONTROL], dlq) as consumer:
        return [r.event async for r in consumer.read_to_end() if run_of(r.event) == run_id]


async def version_served(bus: BusSettings, rollout_id: str) -> int:
    """The weight version the rollout's first recorded call was served by."""
    async with EventProducer(bus) as dlq, EventConsumer(bus, [topics.CALLS], dlq) as consumer:
        async with asyncio.timeout(60):
            async for received in consumer:
                if isinstance(received.event, ModelCall) and received.event.rollout_id == rollout_id:
                    return received.event.weight_version
    raise AssertionError(f"no call of {rollout_id} was recorded")


@pytest.mark.parametrize("backend", ["torch", "verl"])
async def test_pause_drain_update_resume_with_a_real_gateway_and_engine(
        backend: str, bus: BusSettings, own_engine: RunningEngine, tiny_model: Path, tmp_path: Path) -> None:
    """With `backend: verl` the loop starts verl's workers itself (two, on Ray) and loads their weights into the
    engine from the checkpoint, as it does the torch learner's."""
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    with gateway(bus, own_engine, tiny_model, tmp_path / "gateway.log", run_id=run_id) as gw:
        async with EventProducer(bus) as producer:
            await producer.publish_many(task_groups(run_id, 2))
        config = TrainerConfig(run_id=run_id, model=tiny_model, checkpoint_dir=tmp_path / "ckpt", backend=backend,
                               engine_url=own_engine.url, batch_groups=2, max_updates=1, zero_variance="keep")
        state = await Trainer(config, bus).run()
        assert state.version == 1 and len(state.trained) == 2
        logged = tensorboard_scalars(config.run_dir / "tensorboard")  # the default loggers: console, tensorboard
        assert logged.keys() >= NAMES and logged["weight_version"] == [(1, 1.0)]
        assert logged["reward/mean"][0][1] == pytest.approx(state.history[0]["mean_reward"])

        events = await control_events(bus, run_id)
        kinds = [(type(e).__name__, getattr(e, "version", None)) for e in events
                 if isinstance(e, UpdateRequested | GatewayDrained | TrainerStep | WeightVersionPublished)]
        assert kinds == [("UpdateRequested", 1), ("GatewayDrained", 1), ("TrainerStep", 1),
                         ("WeightVersionPublished", 1)]
        [step] = [e for e in events if isinstance(e, TrainerStep)]
        trained = task_groups(run_id, 2)
        assert sorted((a.group_id, a.rollout_id) for a in step.advantages) == sorted(
            (g.group_id, r.rollout_id) for g in trained for r in g.rollouts)  # every rollout trained on, once
        for g in trained:  # each group's advantages are centred on it
            assert abs(sum(a.advantage for a in step.advantages if a.group_id == g.group_id)) < 1e-4
        async with httpx.AsyncClient(timeout=30) as client:
            assert (await client.get(f"{own_engine.url}/v1/weights")).json()["version"] == 1
            deadline = time.monotonic() + 30
            while True:  # the gateway resumes once it reads WeightVersionPublished
                admin = (await client.get(f"{gw.url}/admin/state", headers=gw.admin())).json()
                if (admin["weight_version"] == 1 and not admin["paused"]) or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.2)
            assert admin["weight_version"] == 1 and not admin["paused"], admin
            token = await asyncio.to_thread(gw.register, f"{run_id}-after")
            reply = await client.post(f"{gw.url}/v1/chat/completions", headers={"authorization": f"Bearer {token}"},
                                      json={"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                            "max_tokens": 4})
            assert reply.status_code == 200, reply.text
        assert await version_served(bus, f"{run_id}-after") == 1  # served by the new weights


async def test_an_update_waits_for_the_validation_of_the_version_served_and_the_loggers_get_each_round(
        bus: BusSettings, own_engine: RunningEngine, tiny_model: Path, tmp_path: Path) -> None:
    """The controller validates version 0: update 1 is not requested before its report. The last version is
    published as final, and the trainer stays for its round, so TensorBoard has `val/...` at both versions."""
    run_id = f"run-{uuid.uuid4().hex[:8]}"

    def report(version: int, reward: float) -> ValidationReported:
        return ValidationReported(run_id=run_id, version=version, seconds=1.5, scores=[
            ValidationScore(setting="greedy", temperature=0.0, rollouts=4, mean_reward=reward)])

    with gateway(bus, own_engine, tiny_model, tmp_path / "gateway.log", run_id=run_id):
        config = TrainerConfig(run_id=run_id, model=tiny_model, checkpoint_dir=tmp_path / "ckpt",
                               engine_url=own_engine.url, batch_groups=2, max_updates=2, zero_variance="keep")
        async with EventProducer(bus) as controller:
            await controller.publish(ValidationStarted(run_id=run_id, version=0, rollouts=4))
            await controller.publish_many(task_groups(run_id, 4))
            trainer = asyncio.create_task(Trainer(config, bus).run())
            await asyncio.sleep(8)  # long enough for the trainer to start and have a batch
            assert not [e for e in await control_events(bus, run_id) if isinstance(e, UpdateRequested)]
            await controller.publish(report(0, 0.25))
            async with asyncio.timeout(180):
                while not any(isinstance(e, WeightVersionPublished) and e.final  # noqa: ASYNC110  # the log is polled: no event to wait on
                              for e in await control_events(bus, run_id)):
                    await asyncio.sleep(0.5)
            await asyncio.sleep(2)
            assert not trainer.done()  # it waits for the final version's round
            await controller.publish(ValidationStarted(run_id=run_id, version=2, rollouts=4))
            await controller.publish(report(2, 0.75))
            state = await asyncio.wait_for(trainer, 60)
        events = await control_events(bus, run_id)
    assert state.version == 2
    published = [(e.version, e.final) for e in events if isinstance(e, WeightVersionPublished)]
    assert published == [(1, False), (2, True)]
    order = [(type(e).__name__, getattr(e, "version", None)) for e in events
             if isinstance(e, UpdateRequested | ValidationReported)]
    assert order[:2] == [("ValidationReported", 0), ("UpdateRequested", 1)]
    logged = tensorboard_scalars(config.run_dir / "tensorboard")
    assert logged["val/greedy/reward"] == [(0, 0.25), (2, 0.75)]
    assert logged["val/greedy/rollouts"] == [(0, 4.0), (2, 4.0)]


def test_a_member_is_silent_once_its_lease_passes_and_heartbeats_and_drains_renew_it() -> None:
    now = [0.0]
    control = Control(run_id="r", clock=lambda: now[0])
    control.apply(GatewayJoined(run_id="r", gateway_id="a", url="http://a"))
    control.apply(GatewayJoined(run_id="r", gateway_id="b", url="http://b"))
    control.apply(GatewayJoined(run_id="other", gateway_id="c", url="http://c"))  # another run's gateway
    now[0] = 20.0
    control.apply(GatewayJoined(run_id="r", gateway_id="a", url="http://a"))  # a's heartbeat
    now[0] = 31.0
    assert control.silent(30.0) == {"b": 31.0}
    control.apply(GatewayDrained(run_id="r", version=1, gateway_id="b", held_calls=0))  # a drain is a sign of life
    assert control.silent(30.0) == {} and control.missing(1) == {"a"}
    control.apply(GatewayLeft(run_id="r", gateway_id="a", reason="shut down"))
    assert control.missing(1) == set() and set(control.members) == {"b"}


async def test_an_update_writes_off_a_gateway_killed_without_a_word_and_keeps_the_live_one(
        bus: BusSettings, own_engine: RunningEngine, tiny_model: Path, tmp_path: Path) -> None:
    """A member that joined and died (no GatewayLeft, no heartbeat) held every update until the drain timeout,
    and every other gateway's calls with it; now it is written off once its lease passes."""
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    with gateway(bus, own_engine, tiny_model, tmp_path / "gateway.log", run_id=run_id,
                 TETHER_GATEWAY_HEARTBEAT_S="0.5"):
        async with EventProducer(bus) as producer:
            await producer.publish(GatewayJoined(run_id=run_id, gateway_id="gw-killed", url="http://127.0.0.1:9"))
            await producer.publish_many(task_groups(run_id, 2))
        config = TrainerConfig(run_id=run_id, model=tiny_model, checkpoint_dir=tmp_path / "ckpt",
                               engine_url=own_engine.url, batch_groups=2, max_updates=1, zero_variance="keep",
                               gateway_lease_s=3.0, drain_timeout_s=60.0)
        started = time.monotonic()
        state = await Trainer(config, bus).run()
        took = time.monotonic() - started
        events = await control_events(bus, run_id)
    assert state.version == 1
    assert took < 30, f"the update took {took:.0f} s"
    left = [e for e in events if isinstance(e, GatewayLeft)]
    assert [e.gateway_id for e in left if "silent" in e.reason] == ["gw-killed"]
    assert not [e for e in left if e.gateway_id != "gw-killed" and "silent" in e.reason]  # the live one stayed
    beats = [e for e in events if isinstance(e, GatewayJoined) and e.gateway_id != "gw-killed"]
    assert len(beats) >= 2, "the live gateway's GatewayJoined is its heartbeat"
    assert not [e for e in events if isinstance(e, UpdateAborted)]


def test_killed_mid_run_the_trainer_resumes_without_repeating_or_skipping(
        bus: BusSettings, tiny_model: Path, tmp_path: Path) -> None:
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    groups = task_groups(run_id, 12, seed=3, prompt_tokens=600)  # updates of a second or so: room to kill mid-run

    async def publish() -> None:
        async with EventProducer(bus) as producer:
            await producer.publish_many(groups)
            await producer.publish_many(groups[:3])  # the processors' at-least-once repeats

    asyncio.run(publish())
    config = {"run_id": run_id, "model": str(tiny_model), "checkpoint_dir": str(tmp_path / "ckpt"),
              "batch_groups": 2, "max_updates": 6, "zero_variance": "keep", "max_staleness": 100}
    (tmp_path / "trainer.yaml").write_text(yaml.safe_dump(config))
    command = [sys.executable, "-m", "tether.cli", "trainer", "run", str(tmp_path / "trainer.yaml")]
    env = {**os.environ, "TETHER_BUS_BOOTSTRAP_SERVERS": bus.bootstrap_servers}
    log = (tmp_path / "trainer.log").open("ab")
    first = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    run_dir = tmp_path / "ckpt" / run_id
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:  # until one update is committed
        latest = checkpoint.latest(run_dir)
        if latest is not None and checkpoint.load_state(latest).version >= 1:
            break
        time.sleep(0.05)
    time.sleep(random.uniform(0.0, 1.0))  # then anywhere: mid-update, mid-checkpoint, between updates
    first.send_signal(signal.SIGKILL)
    assert first.wait() == -signal.SIGKILL  # killed, not finished
    killed_at = checkpoint.load_state(checkpoint.latest(run_dir)).version  # type: ignore[arg-type]
    assert killed_at < 6
    second = subprocess.run(command, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=300)
    assert second.returncode == 0, (tmp_path / "trainer.log").read_text()[-3000:]

    latest = checkpoint.latest(run_dir)
    assert latest is not None
    state = checkpoint.load_state(latest)
    assert state.version == 6 and len(state.history) == 6
    assert sorted(state.trained) == sorted(g.group_id for g in groups)  # none skipped, each once (a dict)
    assert Counter(state.trained.values()) == {v: 2 for v in range(1, 7)}  # two per update
    events = asyncio.run(control_events(bus, run_id))
    published = [e.version for e in events if isinstance(e, WeightVersionPublished)]
    assert sorted(set(published)) == list(range(1, 7)) and len(published) == 6, published
    requested = {e.version for e in events if isinstance(e, UpdateRequested)}
    settled = {e.version for e in events if isinstance(e, WeightVersionPublished | UpdateAborted)}
    assert requested <= settled  # no update left pending
    assert json.loads((latest / "state.json").read_text())["offsets"]


def test_the_config_file_takes_paths_from_itself_and_names_a_bad_field(tmp_path: Path) -> None:
    (tmp_path / "trainer.yaml").write_text(yaml.safe_dump({"run_id": "r", "model": "models/tiny", "batch_groups": 4}))
    config = load_config(tmp_path / "trainer.yaml")
    assert config.model == tmp_path / "models" / "tiny" and config.batch_groups == 4
    (tmp_path / "trainer.yaml").write_text(yaml.safe_dump({"run_id": "r", "model": "m", "batch_groups": 0}))
    with pytest.raises(ConfigError, match=r"trainer.yaml: batch_groups: Input should be greater than or equal to 1"):
        load_config(tmp_path / "trainer.yaml")
    (tmp_path / "trainer.yaml").write_text("- a list\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_config(tmp_path / "trainer.yaml")
