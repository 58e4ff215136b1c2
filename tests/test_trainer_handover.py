"""The versions the trainer hands to the engines, against the real broker: adapters loaded by the embedded
engine and by vLLM's and SGLang's routes (their fakes), a version an engine refuses rolled back, an update the
backend could not apply aborted and requested again, and every call stamped with the version that served it."""
from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import httpx
import pytest
import torch

from infra.processes import free_port, stop
from schemas import topics
from schemas.consumer import EventConsumer
from schemas.events import (
    GatewayDrained,
    ModelCall,
    TrainerStep,
    UpdateAborted,
    UpdateRequested,
    WeightVersionPublished,
)
from schemas.producer import EventProducer
from schemas.settings import BusSettings
from tests.conftest import RunningEngine, gateway, serve_engine, spawn
from tests.fakes.held_weights import fingerprint, read_folder
from tests.test_trainer_loop import control_events, task_groups, version_served
from trainer import checkpoint
from trainer.advantages import ScoredGroups
from trainer.config import EngineConfig, TrainerConfig
from trainer.engines.broadcast import Sender
from trainer.engines.fleet import EngineFleet
from trainer.errors import UpdateFailed
from trainer.learner import TorchLearner
from trainer.loop import Control, Trainer
from trainer.metrics import UpdateMetrics


async def test_a_lora_run_hands_each_adapter_to_the_engine_and_says_so(bus: BusSettings, tiny_model: Path,
                                                                        tmp_path: Path) -> None:
    """The same handshake with `lora:`: the checkpoint is an adapter, the engine switches it in on its base, and
    WeightVersionPublished says it is one; the gateway's next call is served by it."""
    from trainer.config import LoraSettings

    run_id = f"run-{uuid.uuid4().hex[:8]}"
    with serve_engine(tiny_model, tmp_path / "engine.log") as engine, \
            gateway(bus, engine, tiny_model, tmp_path / "gateway.log", run_id=run_id) as gw:
        async with EventProducer(bus) as producer:
            await producer.publish_many(task_groups(run_id, 2))
        config = TrainerConfig(run_id=run_id, model=tiny_model, checkpoint_dir=tmp_path / "ckpt", lr=1e-2,
                               engine_url=engine.url, batch_groups=2, max_updates=1, zero_variance="keep",
                               lora=LoraSettings(rank=4, alpha=8), logger=["console"])
        state = await Trainer(config, bus).run()
        assert state.version == 1
        committed = checkpoint.latest(config.run_dir)
        assert committed is not None and (committed / "adapter_model.safetensors").exists()
        [published] = [e for e in await control_events(bus, run_id) if isinstance(e, WeightVersionPublished)]
        assert (published.version, published.adapter, published.checkpoint_path) == (1, True, str(committed))
        async with httpx.AsyncClient(timeout=30) as client:
            assert (await client.get(f"{engine.url}/v1/weights")).json()["version"] == 1
            deadline = time.monotonic() + 30
            while (await client.get(f"{gw.url}/admin/state", headers=gw.admin())).json()["weight_version"] != 1:
                assert time.monotonic() < deadline, "the gateway never took version 1"
                await asyncio.sleep(0.2)
            token = await asyncio.to_thread(gw.register, f"{run_id}-after")
            reply = await client.post(f"{gw.url}/v1/chat/completions", headers={"authorization": f"Bearer {token}"},
                                      json={"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                            "max_tokens": 4})
            assert reply.status_code == 200, reply.text
        assert await version_served(bus, f"{run_id}-after") == 1  # served by the adapter of version 1


class FailsOnce:
    """The torch learner, but its first update fails as the verl backend's does when a worker dies (the
    workers restarted, nothing applied)."""

    def __init__(self, learner: TorchLearner) -> None:
        self.learner, self.failures = learner, 0

    def update(self, scored: ScoredGroups, version: int) -> UpdateMetrics:
        if not self.failures:
            self.failures += 1
            raise UpdateFailed(f"the update of version {version + 1} failed and was not applied: worker lost")
        return self.learner.update(scored, version)

    def stage(self, root: Path, state: checkpoint.TrainerState) -> Path:
        return self.learner.stage(root, state)

    def weight_sender(self, kind: str) -> Sender:
        return self.learner.weight_sender(kind)

    def close(self) -> None:
        self.learner.close()


async def test_an_update_the_backend_could_not_apply_is_aborted_and_requested_again(
        bus: BusSettings, own_engine: RunningEngine, tiny_model: Path, tmp_path: Path) -> None:
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    with gateway(bus, own_engine, tiny_model, tmp_path / "gateway.log", run_id=run_id):
        async with EventProducer(bus) as producer:
            await producer.publish_many(task_groups(run_id, 2))
        config = TrainerConfig(run_id=run_id, model=tiny_model, checkpoint_dir=tmp_path / "ckpt",
                               engine_url=own_engine.url, batch_groups=2, max_updates=1, zero_variance="keep")
        backend = FailsOnce(TorchLearner.load(config, torch.device("cpu"), None))
        state = await Trainer(config, bus, backend=backend).run()
        assert state.version == 1 and len(state.trained) == 2 and backend.failures == 1
        events = await control_events(bus, run_id)
    kinds = [(type(e).__name__, getattr(e, "version", None)) for e in events
             if isinstance(e, UpdateRequested | GatewayDrained | UpdateAborted | TrainerStep | WeightVersionPublished)]
    assert kinds == [("UpdateRequested", 1), ("GatewayDrained", 1), ("UpdateAborted", 1),  # the gateways resume
                     ("UpdateRequested", 1), ("GatewayDrained", 1),  # and drain again for the retry
                     ("TrainerStep", 1), ("WeightVersionPublished", 1)]
    aborted = next(e for e in events if isinstance(e, UpdateAborted))
    assert "worker lost" in aborted.reason
    control = Control(run_id=run_id)
    for e in events[:[type(e) for e in events].index(UpdateAborted) + 2]:
        control.apply(e)
    assert control.pending == 1  # requested again after its abort: pending, for a trainer restarted now


def test_the_committed_version_is_read_from_the_checkpoint_not_from_the_state_an_update_advanced(
        tmp_path: Path, tiny_model: Path) -> None:
    """What the engine watcher brings a replica to must pair a folder with its own version: during an update the
    state already carries the next version while LATEST still names the last commit."""
    config = TrainerConfig(run_id="r", model=tiny_model, checkpoint_dir=tmp_path, engine_url="http://e:1")
    trainer = Trainer(config, BusSettings())
    assert trainer._committed() == (tiny_model, 0)
    staged = checkpoint.stage(config.run_dir, checkpoint.TrainerState(version=1), lambda folder: None)
    final = checkpoint.commit(config.run_dir, staged, 1)
    checkpoint.stage(config.run_dir, checkpoint.TrainerState(version=2), lambda folder: None)  # staged, uncommitted
    assert trainer._committed() == (final, 1)


async def test_a_version_an_engine_refuses_is_aborted_rolled_back_and_trained_again(
        bus: BusSettings, tiny_model: Path, tmp_path: Path) -> None:
    """vLLM (its fake) refuses the first hand-over: the replica is put back on version 0, the update aborted, the
    policy reopened from the last commit (not updated twice), and the retry lands: the engine holds exactly the
    committed version 1, which equals what a run without the refusal commits."""
    port = free_port()
    url, fake = spawn(["tests.fakes.vllm_rl", "--model", str(tiny_model), "--port", str(port)],
                      tmp_path / "vllm.log", "FakeVLLM", port)
    try:
        async with httpx.AsyncClient(base_url=url) as http:
            await http.post("/update_weight_version", json={"new_version": "0"})  # as the trainer's start labels it
            await http.post("/fake/fail", json={"path": "/collective_rpc", "times": 1})
            runs = {}
            for name, engine in (("refused", {"kind": "vllm", "urls": [url]}), ("clean", None)):
                run_id = f"run-{uuid.uuid4().hex[:8]}"
                async with EventProducer(bus) as producer:
                    await producer.publish_many(task_groups(run_id, 2))
                config = TrainerConfig(run_id=run_id, model=tiny_model, checkpoint_dir=tmp_path / name,
                                       engine=engine, batch_groups=2, max_updates=1,
                                       zero_variance="keep")
                state = await Trainer(config, bus).run()
                assert state.version == 1 and len(state.history) == 1
                runs[name] = (run_id, config.run_dir / "v000001")
            held = (await http.get("/fake/state")).json()
    finally:
        stop(fake)
    events = await control_events(bus, runs["refused"][0])
    kinds = [(type(e).__name__, getattr(e, "version", None)) for e in events
             if isinstance(e, UpdateRequested | UpdateAborted | WeightVersionPublished)]
    assert kinds == [("UpdateRequested", 1), ("UpdateAborted", 1), ("UpdateRequested", 1),
                     ("WeightVersionPublished", 1)]
    assert "did not reach the engine" in next(e for e in events if isinstance(e, UpdateAborted)).reason
    assert held["calls"].count("/collective_rpc") == 3  # refused, the rollback to version 0, the retry
    assert held["label"] == "1" and not held["paused"]
    committed = {name: read_folder(folder) for name, (_, folder) in runs.items()}
    assert held["fingerprint"] == fingerprint(committed["refused"].items())
    for name, tensor in committed["clean"].items():
        torch.testing.assert_close(committed["refused"][name], tensor)


@pytest.mark.parametrize("lora", [False, True], ids=["weights", "lora"])
@pytest.mark.parametrize("kind", ["vllm", "sglang"])
async def test_every_call_is_stamped_with_the_version_the_replica_serving_it_holds(
        kind: str, lora: bool, bus: BusSettings, tiny_model: Path, tmp_path: Path) -> None:
    """The loop closed on vLLM and on SGLang (their fakes, which answer "weights LABEL" with the label of the
    weights they hold, and the adapter a call asked for): a call before the update is served by the launch weights
    and recorded as version 0; the trainer hands version 1 over by the engine's own routes and the next call is
    served by it and recorded as 1; the replica restarts onto its launch weights, and a call then waits until the
    replica is brought up, served by version 1 again. With `lora:` version 1 is an adapter, loaded by the engine's
    LoRA routes, and the gateway asks for it in the engine's own way."""
    from trainer.config import LoraSettings

    port = free_port()
    module = {"vllm": "tests.fakes.vllm_rl", "sglang": "tests.fakes.sglang"}[kind]
    args = [module, "--model", str(tiny_model), "--port", str(port), "--completions",
            *(["--enable-lora"] if lora and kind == "sglang" else [])]
    env = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"} if lora and kind == "vllm" else None
    served_1 = "weights 1 adapter tether-lora" if lora else "weights 1"
    url, fake = spawn(args, tmp_path / f"{kind}.log", f"{kind} fake", port, env)
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    try:
        with gateway(bus, RunningEngine(url, str(tiny_model), fake), tiny_model, tmp_path / "gateway.log",
                     run_id=run_id, TETHER_GATEWAY_ENGINE_KIND=kind, TETHER_GATEWAY_ENGINE_CHECK_S="0.2") as gw:
            async with httpx.AsyncClient(timeout=60) as http:
                async def call(rollout_id: str) -> str:
                    token = await asyncio.to_thread(gw.register, rollout_id)
                    reply = await http.post(f"{gw.url}/v1/chat/completions", json={
                        "model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 32},
                        headers={"authorization": f"Bearer {token}"})
                    assert reply.status_code == 200, reply.text
                    return str(reply.json()["choices"][0]["message"]["content"])

                assert await call(f"{run_id}-before") == "weights default"
                async with EventProducer(bus) as producer:
                    await producer.publish_many(task_groups(run_id, 2))
                config = TrainerConfig(run_id=run_id, model=tiny_model, checkpoint_dir=tmp_path / "ckpt",
                                       engine={"kind": kind, "urls": [url]}, batch_groups=2,
                                       max_updates=1, zero_variance="keep",
                                       lora=LoraSettings(rank=4, alpha=8) if lora else None)
                await Trainer(config, bus).run()
                async with asyncio.timeout(30):
                    while (await http.get(f"{gw.url}/admin/state", headers=gw.admin())).json()["weight_version"] < 1:  # noqa: ASYNC110  # polled: no event to wait on
                        await asyncio.sleep(0.2)
                assert await call(f"{run_id}-after") == served_1

                stop(fake)
                url, fake = spawn(args, tmp_path / f"{kind}-restarted.log", f"{kind} fake", port, env)
                waiting = asyncio.create_task(call(f"{run_id}-restarted"))
                await asyncio.sleep(2.0)
                assert not waiting.done()  # not served by the launch weights under version 1's stamp
                fleet = EngineFleet(EngineConfig(kind=kind, urls=[url]))  # as the trainer's watcher does
                assert await fleet.bring_up(config.run_dir / "v000001", 1) == [url]
                await fleet.aclose()
                assert await asyncio.wait_for(waiting, 30) == served_1
    finally:
        stop(fake)
    stamped: dict[str, int] = {}
    async with EventProducer(bus) as dlq, EventConsumer(bus, [topics.CALLS], dlq) as consumer:
        async for received in consumer.read_to_end():
            if isinstance(received.event, ModelCall) and received.event.rollout_id.startswith(run_id):
                stamped[received.event.rollout_id.removeprefix(f"{run_id}-")] = received.event.weight_version
    assert stamped == {"before": 0, "after": 1, "restarted": 1}
