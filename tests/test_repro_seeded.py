"""A seeded run repeats bit for bit: the openai-SDK agent on the embedded engine in its deterministic mode, run
again by the same run file or by `tether repro` from the record.

Run A goes alone; run B (the same seed) goes at the same time as run C (another
seed), so B's calls share the engine's batches with C's. A's and B's training
data hash alike (names and times aside) and every call pairs identical; C's
differ, which shows the seeds reach the samples.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM

from controller.config import load_config
from controller.main import run
from repro.diverge import compare, rollouts
from repro.runner import hand_over, plan, rerun
from schemas.calls import whole
from schemas.events import ModelCall, WeightVersionPublished
from schemas.producer import EventProducer
from schemas.settings import BusSettings
from stream_processors.grouping import Policy
from stream_processors.pipeline import rebuild, training_hash
from stream_processors.replay import read_run_events
from tests.conftest import RunningEngine, RunningGateway, gateway, serve_engine
from tests.test_controller_examples import EXAMPLES, controller_settings
from trainer.engines.tether import TetherReplica

TASKS = [{"id": f"q{i}", "question": f"What is {w}?", "answer": a} for i, (w, a) in enumerate([("x", "42"),
                                                                                                 ("y", "7")])]


@pytest.fixture(scope="module")
def deterministic_engine(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningEngine]:
    with serve_engine(tiny_model, tmp_path_factory.mktemp("engine") / "engine.log",
                      TETHER_ENGINE_DETERMINISTIC="true") as engine:
        assert httpx.get(f"{engine.url}/health").json()["deterministic"] is True
        yield engine


def _run_file(folder: Path, run_id: str, seed: int, tasks: list[dict[str, str]]) -> Path:
    folder.mkdir()
    (folder / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    (folder / "run.yaml").write_text(yaml.safe_dump({
        "run_id": run_id, "dataset": "tasks.jsonl", "group_size": 3, "timeout_s": 120, "seed": seed,
        "sandbox": {"workdir": "work/{rollout_id}", "read_only": [str(EXAMPLES / "openai_agent.py")]},
        "harness": {"setup": ["mkdir", "-p", "work/{rollout_id}"], "workdir": ".",
                    "command": [sys.executable, str(EXAMPLES / "openai_agent.py"), "--max-turns", "3",
                                "--max-tokens", "24"]}}))
    return folder / "run.yaml"


async def _run(folder: Path, run_id: str, seed: int, bus: BusSettings, gw: RunningGateway) -> None:
    view = await run(load_config(_run_file(folder, run_id, seed, TASKS)), controller_settings(bus, gw))
    assert len(view.rollouts) == 6 and all(s.finished and s.finished.status == "succeeded"
                                           for s in view.rollouts.values())


async def test_a_seeded_run_of_the_openai_agent_repeats_bit_for_bit(
        bus: BusSettings, deterministic_engine: RunningEngine, tiny_model: Path, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:6]
    a, b, c = f"seeded-a-{tag}", f"seeded-b-{tag}", f"seeded-c-{tag}"
    with gateway(bus, deterministic_engine, tiny_model, tmp_path / "gateway.log") as gw:
        await _run(tmp_path / "a", a, 5, bus, gw)
        await asyncio.gather(_run(tmp_path / "b", b, 5, bus, gw), _run(tmp_path / "c", c, 6, bus, gw))
    hashes, paired = {}, {}
    for run_id in (a, b, c):
        events = await read_run_events(bus, run_id)
        groups = rebuild(events, run_id, Policy())
        assert len(groups) == 2 and all(not g.partial and len(g.rollouts) == 3 for g in groups)
        hashes[run_id] = training_hash(groups, run_id)
        calls = whole(e for e in events if isinstance(e, ModelCall))
        paired[run_id] = rollouts([*(e for e in events if not isinstance(e, ModelCall)), *calls], run_id)
    same = compare(a, paired[a], b, paired[b])
    assert (same.pairs, same.identical_rollouts) == (6, 6) and same.identical_calls == same.calls >= 6
    assert hashes[a] == hashes[b]
    other = compare(a, paired[a], c, paired[c])
    assert other.pairs == 0 and hashes[c] != hashes[a]  # other seeds pair with nothing, and sample otherwise


def _changed_weights(tiny_model: Path, folder: Path) -> Path:
    """A checkpoint of version 1: the tiny model with its final norm flipped, which changes every answer."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    with torch.no_grad():
        model.model.norm.weight.mul_(-1.0)
    model.save_pretrained(folder)
    return folder


async def test_repro_runs_a_recorded_run_again_each_rollout_on_its_version(
        bus: BusSettings, deterministic_engine: RunningEngine, tiny_model: Path, tmp_path: Path) -> None:
    """Run A: task q0 on version 0; then the engine gets version 1 and A goes on with q1. `tether repro` runs A's
    rollouts again as R, q0 on the base and q1 on A's checkpoint of version 1: every call the same as A's."""
    tag = uuid.uuid4().hex[:6]
    a, r = f"recorded-{tag}", f"recorded-{tag}-repro"
    settings_file = _run_file(tmp_path / "a", a, 3, TASKS[:1])
    replica = TetherReplica(deterministic_engine.url)
    checkpoint = await asyncio.to_thread(_changed_weights, tiny_model, tmp_path / "v1")
    with gateway(bus, deterministic_engine, tiny_model, tmp_path / "gateway.log") as gw:
        settings = controller_settings(bus, gw)
        await hand_over([replica], tiny_model, 0)  # whatever an earlier test left on the engine
        await run(load_config(settings_file), settings)
        await hand_over([replica], checkpoint, 1)
        async with EventProducer(bus) as producer:
            await producer.publish(WeightVersionPublished(run_id=a, version=1, checkpoint_path=str(checkpoint)))
        await asyncio.to_thread((tmp_path / "a" / "tasks.jsonl").write_text,
                                "".join(json.dumps(t) + "\n" for t in TASKS))
        await run(load_config(settings_file), settings)  # q0 is done: q1 starts, on version 1
        phases = await plan(settings, a, r)
        assert [(p.version, p.checkpoint, len(p.launches)) for p in phases] == [(0, None, 3), (1, str(checkpoint), 3)]
        kept = tmp_path / "a" / ".tether" / "runs" / a / "run.yaml"  # what the controller kept of run A
        await rerun(load_config(kept).model_copy(update={"run_id": r}), settings, phases, [replica], tiny_model)
    events = {run_id: await read_run_events(bus, run_id) for run_id in (a, r)}
    versions = {run_id: {(c.rollout_id.split(".")[1], c.weight_version) for c in events[run_id]
                         if isinstance(c, ModelCall)} for run_id in (a, r)}
    assert versions[a] == versions[r] == {("q0", 0), ("q1", 1)}
    paired = {run_id: rollouts([*(e for e in events[run_id] if not isinstance(e, ModelCall)), *whole(
        e for e in events[run_id] if isinstance(e, ModelCall))], run_id) for run_id in (a, r)}
    same = compare(a, paired[a], r, paired[r])
    assert (same.pairs, same.identical_rollouts) == (6, 6) and same.identical_calls == same.calls
    assert training_hash(rebuild(events[a], a, Policy()), a) == training_hash(rebuild(events[r], r, Policy()), r)


def test_the_repro_command_says_what_it_lacks(bus: BusSettings, tmp_path: Path) -> None:
    env = {**os.environ, "TETHER_BUS_BOOTSTRAP_SERVERS": bus.bootstrap_servers}
    missing = subprocess.run([sys.executable, "-m", "tether.cli", "repro", "never-ran"], capture_output=True,
                             text=True, timeout=120, env=env, cwd=tmp_path)
    assert missing.returncode == 2 and "the controller kept none at .tether/runs/never-ran/run.yaml" in missing.stderr
    run_file = _run_file(tmp_path / "x", "never-ran", 0, TASKS)
    empty = subprocess.run([sys.executable, "-m", "tether.cli", "repro", "never-ran", "--run-file", str(run_file)],
                           capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert empty.returncode == 1 and "no rollouts of run 'never-ran' to run again" in empty.stderr, empty.stderr
    kind = subprocess.run([sys.executable, "-m", "tether.cli", "repro", "never-ran", "--run-file", str(run_file),
                           "--engine-kind", "tgi"], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert kind.returncode == 2 and "--engine-kind: 'tgi' is not one of tether, vllm, sglang" in kind.stderr
