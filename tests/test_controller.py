"""The controller on the real broker and a real gateway: launching, rewards, failures, and a crash mid-run."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.config import RunConfig, load_config
from controller.errors import ConfigError
from controller.main import run
from controller.plan import DONE
from controller.recorded import read_run
from controller.settings import ControllerSettings
from schemas import topics
from schemas.consumer import EventConsumer
from schemas.events import RolloutSealed, RolloutStarted, run_of
from schemas.producer import EventProducer
from schemas.seeds import rollout_seed
from schemas.settings import BusSettings
from tests.conftest import ADMIN_KEY, SECRET, RunningGateway

ROOT = Path(__file__).parent.parent
HARNESS = [sys.executable, str(Path(__file__).parent / "harnesses" / "scripted.py")]


def write_run(tmp_path: Path, run_id: str, tasks: list[dict[str, Any]], **overrides: Any) -> Path:
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    config = {"run_id": run_id, "dataset": "tasks.jsonl", "group_size": 2, "concurrency": 4, "timeout_s": 30,
              "grace_s": 1, "log_dir": "logs",
              "harness": {"command": HARNESS, "env": {"TEST_LEDGER": str(tmp_path / "ledger")}},
              "sandbox": False, **overrides}  # its harness writes a ledger beside the run (tests/sandbox has its own)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def settings(bus: BusSettings, gateway: RunningGateway) -> ControllerSettings:
    return ControllerSettings(gateway_url=gateway.url, gateway_admin_key=ADMIN_KEY, gateway_secret=SECRET, bus=bus)


def ledger(tmp_path: Path) -> Counter[str]:
    path = tmp_path / "ledger"
    return Counter(line.split()[0] for line in path.read_text().splitlines()) if path.exists() else Counter()


async def sealed(bus: BusSettings, rollout_ids: set[str]) -> dict[str, RolloutSealed]:
    found: dict[str, RolloutSealed] = {}
    async with EventProducer(bus) as dlq, EventConsumer(bus, [topics.CALLS], dlq) as consumer:
        deadline = time.monotonic() + 30
        async for batch in consumer.batches(timeout_ms=200):
            for r in batch:
                if isinstance(r.event, RolloutSealed) and r.event.rollout_id in rollout_ids:
                    found[r.event.rollout_id] = r.event
            if set(found) == rollout_ids or time.monotonic() > deadline:
                return found
    return found


async def test_k_rollouts_per_task_with_rewards_posted_by_the_harness(
        bus: BusSettings, scripted_gateway: RunningGateway, tmp_path: Path, run_id: str) -> None:
    config = load_config(write_run(tmp_path, run_id, [{"id": "t1", "reward": 1.0}, {"id": "t/2", "reward": 0.25}]))
    view = await run(config, settings(bus, scripted_gateway))
    assert len(view.rollouts) == 4 and not view.running()
    for state in view.rollouts.values():
        assert state.finished is not None and state.finished.status == "succeeded", state.finished
        assert state.finished.reward == json.loads(state.started.task_json)["reward"]
        assert state.finished.exit_code == 0 and state.started.group_size == 2
    assert sorted(ledger(tmp_path).values()) == [1, 1, 1, 1]  # each rollout ran once
    assert set(await sealed(bus, set(view.rollouts))) == set(view.rollouts)  # and was sealed at the gateway
    for rid in view.rollouts:
        assert (config.run_dir / f"{rid}.log").exists()
    # What `tether rollouts ls` reads back from the topic is the same run.
    replayed = await read_run(bus, run_id)
    assert {r: s.finished.status for r, s in replayed.rollouts.items() if s.finished} == \
        {r: "succeeded" for r in view.rollouts}
    listing = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tether.cli", "rollouts", "ls", "--run", run_id, stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "TETHER_BUS_BOOTSTRAP_SERVERS": bus.bootstrap_servers, "COLUMNS": "250"})
    out = (await listing.communicate())[0].decode()
    assert listing.returncode == 0 and out.count("succeeded") == 4, out
    assert all(rid in out for rid in view.rollouts), out


async def test_rewards_from_a_command_and_the_ways_a_rollout_fails(
        bus: BusSettings, scripted_gateway: RunningGateway, tmp_path: Path, run_id: str) -> None:
    score = "import json, os; print('scoring...'); print(json.loads(os.environ['TETHER_TASK'])['score'])"
    tasks: list[dict[str, Any]] = [
        {"id": "good", "score": '{"reward": 0.75}'}, {"id": "bad-output", "score": "not a number"},
        {"id": "crashes", "score": "1", "exit": 3}, {"id": "no-field"}]
    config = load_config(write_run(tmp_path, run_id, tasks, group_size=1,
                                   reward={"source": "command", "command": [sys.executable, "-c", score]}))
    view = await run(config, settings(bus, scripted_gateway))
    by_task = {s.started.task_id: s.finished for s in view.rollouts.values()}
    assert by_task["good"] and (by_task["good"].status, by_task["good"].reward) == ("succeeded", 0.75)
    assert by_task["bad-output"] and by_task["bad-output"].status == "failed"
    assert by_task["bad-output"].reward is None and "not a number" in (by_task["bad-output"].reason or "")
    assert by_task["crashes"] and by_task["crashes"].status == "failed" and by_task["crashes"].exit_code == 3
    assert by_task["no-field"] and by_task["no-field"].status == "failed"  # the reward command itself failed


async def test_a_missing_reward_fails_the_rollout(bus: BusSettings, scripted_gateway: RunningGateway,
                                                  tmp_path: Path, run_id: str) -> None:
    config = load_config(write_run(tmp_path, run_id, [{"id": "silent"}], group_size=1, reward={"wait_s": 0.5}))
    view = await run(config, settings(bus, scripted_gateway))
    (state,) = view.rollouts.values()
    assert state.finished and state.finished.status == "failed" and state.finished.reward is None
    assert "no reward" in (state.finished.reason or "")


async def test_a_timeout_kills_the_whole_process_group(bus: BusSettings, scripted_gateway: RunningGateway,
                                                       tmp_path: Path, run_id: str) -> None:
    config = load_config(write_run(tmp_path, run_id, [{"id": "slow", "sleep": 60, "ignore_term": True,
                                                       "child": True}], group_size=1, timeout_s=1.5))
    view = await run(config, settings(bus, scripted_gateway))
    (state,) = view.rollouts.values()
    assert state.finished and state.finished.status == "timeout" and state.finished.duration_s < 15
    (grandchild,) = [int(p) for p in (tmp_path / "ledger.children").read_text().split()]
    deadline = time.monotonic() + 10
    while not gone(grandchild) and time.monotonic() < deadline:  # noqa: ASYNC110  # a pid has no event
        await asyncio.sleep(0.1)
    assert gone(grandchild)


async def starts(bus: BusSettings, run_id: str) -> Counter[str]:
    """How often each rollout of the run was started, as the topic says."""
    started = Counter[str]()
    async with EventProducer(bus) as dlq, EventConsumer(bus, [topics.ROLLOUTS], dlq) as consumer:
        async for r in consumer.read_to_end():
            if isinstance(r.event, RolloutStarted) and r.event.run_id == run_id:
                started[r.event.rollout_id] += 1
    return started


def gone(pid: int) -> bool:
    """Not running: no such process, or a zombie waiting for its reaper."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


async def test_a_harness_that_cannot_start_is_retried_as_new_attempts(
        bus: BusSettings, scripted_gateway: RunningGateway, tmp_path: Path, run_id: str) -> None:
    config = load_config(write_run(tmp_path, run_id, [{"id": "t"}], group_size=1, max_attempts=3,
                                   harness={"command": [str(tmp_path / "missing-harness")]}))
    view = await run(config, settings(bus, scripted_gateway))
    attempts = sorted(view.rollouts.values(), key=lambda s: s.started.attempt)
    assert [s.started.attempt for s in attempts] == [0, 1, 2]
    assert [s.started.retry_of for s in attempts] == [None, attempts[0].started.rollout_id,
                                                      attempts[1].started.rollout_id]
    assert all(s.finished and s.finished.status == "lost" and "could not start" in (s.finished.reason or "")
               for s in attempts)


def test_config_errors_name_the_field(tmp_path: Path) -> None:
    path = write_run(tmp_path, "r", [{"id": "t"}], group_size=0)
    with pytest.raises(ConfigError, match="group_size"):
        load_config(path)
    path = write_run(tmp_path, "r", [{"id": "t"}], reward={"source": "command"})
    with pytest.raises(ConfigError, match="reward"):
        load_config(path)
    path = write_run(tmp_path, "r", [{"id": "t"}], runner="kubernetes")
    with pytest.raises(ConfigError, match="job_template"):
        load_config(path)
    path = write_run(tmp_path, "r", [{"id": "t"}], runner="kubernetes",
                     harness={"job_template": "job.yaml", "preload": ["openai"]})
    with pytest.raises(ConfigError, match="preload"):
        load_config(path)
    path = write_run(tmp_path, "r", [{"id": "t"}], colour="blue")
    with pytest.raises(ConfigError, match="colour"):
        load_config(path)
    assert isinstance(load_config(write_run(tmp_path, "r", [{"id": "t"}])), RunConfig)


@pytest.mark.parametrize("paths", ["absolute", "relative"])
def test_killed_mid_run_and_restarted_every_group_ends_with_k(
        bus: BusSettings, scripted_gateway: RunningGateway, tmp_path: Path, run_id: str, paths: str) -> None:
    """SIGKILL the controller while harnesses run; the restarted one re-attaches and launches only what is missing.
    `relative`: as the README runs an example, the run file named relative to the controller's directory and
    the harness in a workdir of its own; a harness that ends while no controller watches still leaves its exit
    code where the next controller looks (before, the wrapper wrote it relative to the workdir and failed, and
    the restarted controller ran that rollout's harness again)."""
    tasks = [{"id": f"t{i}", "sleep": 1.0 + 0.3 * (i % 3), "reward": i / 10} for i in range(6)]
    workdir = {"workdir": "work"} if paths == "relative" else {}
    (tmp_path / "work").mkdir()
    path = write_run(tmp_path, run_id, tasks, group_size=3, concurrency=4, max_groups_in_flight=2)
    config = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**config, "harness": {**config["harness"], **workdir}}))
    env = {**os.environ, "TETHER_BUS_BOOTSTRAP_SERVERS": bus.bootstrap_servers,
           "TETHER_CONTROLLER_GATEWAY_URL": scripted_gateway.url, "TETHER_CONTROLLER_GATEWAY_ADMIN_KEY": ADMIN_KEY,
           "TETHER_CONTROLLER_GATEWAY_SECRET": SECRET, "PYTHONPATH": str(ROOT)}
    run_file = str(path) if paths == "absolute" else path.name
    command = [sys.executable, "-m", "tether.cli", "controller", "run", run_file]
    log = (tmp_path / "controller.log").open("wb")
    first = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    deadline = time.monotonic() + 60
    while sum(ledger(tmp_path).values()) < 6 and time.monotonic() < deadline:  # some ran, some run now
        time.sleep(0.1)
    first.send_signal(signal.SIGKILL)
    first.wait()
    running_at_kill = len(ledger(tmp_path))
    second = subprocess.run(command, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=240, cwd=tmp_path)
    assert second.returncode == 0, (tmp_path / "controller.log").read_text()[-2000:]

    view = asyncio.run(read_run(bus, run_id, group_size=3, max_attempts=3))
    started = asyncio.run(starts(bus, run_id))
    assert running_at_kill >= 6
    assert max(started.values()) == 1  # no rollout started twice
    assert max(ledger(tmp_path).values()) == 1  # no harness ran twice
    assert len(started) == 18 == len(view.rollouts)  # and none again as a later attempt: nothing was lost
    assert all(s.finished and s.finished.status == "succeeded" for s in view.rollouts.values()), \
        [(rid, s.finished) for rid, s in view.rollouts.items()]
    for gid in view.slots:
        counted = view.finished_rollouts(gid)
        assert len(counted) == 3 and all(s.finished and s.finished.status in DONE for s in counted), gid
    assert len(view.slots) == 6



async def test_a_run_on_kubernetes(bus: BusSettings, scripted_gateway: RunningGateway, kube_api: str,
                                   tmp_path: Path, run_id: str) -> None:
    """The same run as Jobs on FakeKubeAPI (a fake API server): env injected, rewards, a failing and a slow task."""
    template = yaml.safe_load((ROOT / "infra" / "k8s" / "job-template.yaml").read_text())
    template["spec"]["template"]["spec"]["containers"][0]["command"] = [*HARNESS, "{task_id}"]
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(template))
    tasks = [{"id": "ok", "reward": 0.5}, {"id": "fails", "exit": 4}, {"id": "slow", "sleep": 30}]
    config = load_config(write_run(tmp_path, run_id, tasks, runner="kubernetes", timeout_s=2,
                                   harness={"job_template": "job.yaml",
                                            "env": {"TEST_LEDGER": str(tmp_path / "ledger")}},
                                   kubernetes={"host": kube_api, "namespace": "agents"}))
    view = await run(config, settings(bus, scripted_gateway))
    outcomes = Counter((s.started.task_id, s.finished.status if s.finished else None, s.finished and s.finished.reward)
                       for s in view.rollouts.values())
    assert outcomes == Counter({("ok", "succeeded", 0.5): 2, ("fails", "failed", None): 2,
                                ("slow", "timeout", None): 2})
    assert all(s.started.runner == "kubernetes" for s in view.rollouts.values())
    assert sorted(ledger(tmp_path).values()) == [1] * 6


async def test_synchronous_mode_waits_for_the_trainer_between_batches(
        bus: BusSettings, scripted_gateway: RunningGateway, tmp_path: Path, run_id: str) -> None:
    from schemas.events import WeightVersionPublished

    config = load_config(write_run(tmp_path, run_id, [{"id": f"t{i}", "reward": 1.0} for i in range(4)],
                                   group_size=1, sync_batch=2))
    running = asyncio.create_task(run(config, settings(bus, scripted_gateway)))
    deadline = time.monotonic() + 60
    while sum(ledger(tmp_path).values()) < 2 and time.monotonic() < deadline:  # noqa: ASYNC110  # a file
        await asyncio.sleep(0.1)
    await asyncio.sleep(3.0)  # the first batch is done; without a new version nothing more may start
    assert sum(ledger(tmp_path).values()) == 2 and not running.done()
    async with EventProducer(bus) as producer:
        await producer.publish(WeightVersionPublished(run_id=run_id, version=1))
    view = await asyncio.wait_for(running, 60)
    started = sorted((s.started.task_id, s.started.weight_version) for s in view.rollouts.values())
    assert started == [("t0", 0), ("t1", 0), ("t2", 1), ("t3", 1)]


async def _control_events(bus: BusSettings, run_id: str, wanted: type, count: int) -> list[Any]:
    """The run's first `count` events of type `wanted` on tether.control."""
    found: list[Any] = []
    async with EventProducer(bus) as dlq, EventConsumer(bus, [topics.CONTROL], dlq) as consumer:
        async with asyncio.timeout(90):
            async for batch in consumer.batches(timeout_ms=200):
                found += [r.event for r in batch if isinstance(r.event, wanted) and run_of(r.event) == run_id]
                if len(found) >= count:
                    return found[:count]
    raise AssertionError("unreachable")


async def test_validation_rounds_at_the_first_every_nth_and_final_version(
        bus: BusSettings, scripted_gateway: RunningGateway, tmp_path: Path, run_id: str) -> None:
    """The trainer's versions arrive; the controller validates 0, 2 and the final 3 (not 1), each setting of each
    held-out task with a token that pins its temperature, before any training rollout of the round's time, and
    stops launching training rollouts once the trainer is done, then exits by itself."""
    from schemas.events import ValidationReported, ValidationStarted, WeightVersionPublished
    from schemas.rollout_token import claims

    (tmp_path / "held_out.jsonl").write_text("".join(json.dumps(t) + "\n" for t in [
        {"id": "h1", "reward": 1.0}, {"id": "h2", "reward": 0.0}, {"id": "h3", "reward": 0.5}]))
    tasks = [{"id": f"t{i}", "reward": 1.0, "sleep": 0.3} for i in range(200)]
    config = load_config(write_run(tmp_path, run_id, tasks, group_size=2, concurrency=4, validation={
        "dataset": "held_out.jsonl", "every": 2, "temperatures": [0.0, None]}))
    controller = asyncio.create_task(run(config, settings(bus, scripted_gateway)))
    async with EventProducer(bus) as trainer:
        for version in (0, 2, 3):
            reports = await _control_events(bus, run_id, ValidationReported, {0: 1, 2: 2, 3: 3}[version])
            assert reports[-1].version == version
            if version == 0:
                for v in (1, 2):
                    await trainer.publish(WeightVersionPublished(run_id=run_id, version=v))
            elif version == 2:
                await trainer.publish(WeightVersionPublished(run_id=run_id, version=3, final=True))
    state = await asyncio.wait_for(controller, 90)  # it ends by itself after the final round
    assert state.final == 3 and sorted(state.rounds) == [0, 2, 3]
    started = await _control_events(bus, run_id, ValidationStarted, 3)
    assert [s.version for s in started] == [0, 2, 3] and all(s.rollouts == 6 for s in started)
    for report in reports:
        assert [(s.setting, s.temperature, s.rollouts, s.mean_reward) for s in report.scores] == \
            [("greedy", 0.0, 3, 0.5), ("harness", None, 3, 0.5)]
    held = [s.started for s in state.rollouts.values() if s.started.validation]
    assert len(held) == 18 and {(s.weight_version, s.temperature) for s in held} == \
        {(v, t) for v in (0, 2, 3) for t in (0.0, None)}
    assert all(s.group_size == 1 and ".val" in s.group_id for s in held)
    order = sorted(state.rollouts.values(), key=lambda s: s.started.started_at)
    assert all(s.started.validation for s in order[:6])  # the first round went out before any training rollout
    final_seen = max(s.started_at for s in held if s.weight_version == 3)
    assert not any(s.started.started_at > final_seen for s in order if not s.started.validation)
    assert not any(s.started.weight_version == 3 for s in order if not s.started.validation)
    assert state.slots and not any(gid in state.slots for gid in state.validation_slots)
    # Each harness's key pins its setting's temperature (the gateway applies it to every call); training keys pin
    # nothing.
    keys = {line.split()[0]: line.split()[2:] for line in (tmp_path / "ledger").read_text().splitlines()}
    for s in state.rollouts.values():
        found = claims(keys[s.started.rollout_id][0], SECRET)
        assert found is not None and found.temperature == s.started.temperature
    # Every rollout has its seed: on the record, in its key and in TETHER_SEED; from the run's seed (0 here), the
    # task and its index, so each validation round's rollout of a task and slot has the same one, apart from
    # training's.
    for s in state.rollouts.values():
        found = claims(keys[s.started.rollout_id][0], SECRET)
        slot = state.rollouts[s.started.rollout_id].slot
        assert s.started.seed == rollout_seed(0, s.started.task_id, slot, s.started.validation)
        assert found is not None and found.seed == s.started.seed and keys[s.started.rollout_id][1] == str(found.seed)
    assert len({s.seed for s in held}) == 3  # three held-out tasks of one slot each, the same seed every round


async def test_a_training_rollout_is_not_started_when_the_final_version_lands_while_it_registers(
        tmp_path: Path) -> None:
    """The race the validation test once lost: the trainer's final version arrives during the gateway's register
    call. Nothing that rollout produced could be trained on, so no RolloutStarted is published and no harness
    starts; a validation rollout in the same position still runs (its round validates that version)."""
    from controller.controller import Controller
    from controller.plan import Launch
    from schemas.events import WeightVersionPublished

    run_id = "run-race"
    config = load_config(write_run(tmp_path, run_id, [{"id": "t0", "reward": 1.0}]))
    published: list[Any] = []
    started: list[str] = []

    class Producer:
        async def publish(self, event: Any) -> None:
            published.append(event)

    class Admin:
        async def register(self, rollout_id: str, run: str) -> None:
            controller.state.apply(WeightVersionPublished(run_id=run_id, version=3, final=True))

    class Runner:
        async def start(self, spec: Any) -> None:
            started.append(spec.rollout_id)

    controller: Controller[Any] = Controller(
        config, ControllerSettings(), [{"id": "t0"}], runner=Runner(),  # type: ignore[arg-type]
        spec_of=lambda spec, fill: spec, producer=Producer(), admin=Admin())  # type: ignore[arg-type]
    controller._watch = lambda spec, at: None  # type: ignore[method-assign,assignment]  # nothing to supervise
    training = Launch(f"{run_id}-t0-0-0", f"{run_id}-t0", {"id": "t0"}, 0, 0, None)
    await controller._launch(training)
    assert published == [] and started == []
    held_out = Launch(f"{run_id}-h0-v3g-0-0", f"{run_id}-h0.val", {"id": "h0"}, 0, 0, None, validation=True,
                      temperature=0.0, group_size=1)
    await controller._launch(held_out)
    assert [type(e).__name__ for e in published] == ["RolloutStarted"] and started == [held_out.rollout_id]
    assert published[0].weight_version == 3 and published[0].validation
