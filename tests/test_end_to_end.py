"""The whole stack on its own broker: `tether up`, two unmodified harnesses run by the controller (the openai-SDK
agent, and mini-swe-agent on a one-file task), updates that pause and resume the gateway, replay equal to what was
trained, analytics rows, `tether down` leaving nothing running.

The model is the tiny random one, so mini-swe-agent never writes the file (reward 0): what is checked is that its
calls, made through litellm with its own prompts, are recorded, grouped and trained on like any other harness's."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from analytics.report import run_queries
from analytics.sink import connect
from controller.config import load_config
from controller.main import run
from controller.settings import ControllerSettings
from infra.kafka.launcher import KafkaBroker
from infra.processes import free_port
from schemas.events import GatewayDrained, ModelCall, UpdateRequested, WeightVersionPublished
from schemas.samples import unique_groups
from schemas.settings import BusSettings
from stream_processors.grouping import Policy
from stream_processors.pipeline import content_hash
from stream_processors.replay import replay
from tests.test_trainer_loop import control_events
from tether.stack import Stack, StackSettings
from trainer import checkpoint

EXAMPLES = Path(__file__).parent.parent / "examples"
AGENT = EXAMPLES / "openai_agent.py"


def mini_swe_agent_run(folder: Path, run_id: str) -> Path:
    """The example's run file and overlay, with a second trivial task, two steps and short replies."""
    folder.mkdir()
    for name in ("run.yaml", "tether.yaml"):
        shutil.copy(EXAMPLES / "mini_swe_agent" / name, folder / name)
    tasks = [{"id": f"file-{n}", "problem": f"Create a file {n}.txt containing the word hi.", "file": f"{n}.txt",
              "content": "hi"} for n in ("a", "b")]
    (folder / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    overlay = yaml.safe_load((folder / "tether.yaml").read_text())
    overlay["agent"]["step_limit"] = 2
    overlay["model"]["model_kwargs"]["max_tokens"] = 24
    (folder / "tether.yaml").write_text(yaml.safe_dump(overlay))
    run = yaml.safe_load((folder / "run.yaml").read_text())
    run.update(run_id=run_id, timeout_s=120, log_dir="rollouts")
    (folder / "run.yaml").write_text(yaml.safe_dump(run))
    return folder / "run.yaml"


def test_the_stack_trains_unmodified_harnesses(own_broker: KafkaBroker, tiny_model: Path, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")  # `mini` is installed here
    run_id = "e2e"
    settings = StackSettings(run_id=run_id, home=tmp_path / "home", model=tiny_model, engine_port=free_port(),
                             gateway_port=free_port(), trainer={"batch_groups": 2, "max_updates": 3,
                                                                "zero_variance": "keep", "max_staleness": 100})
    stack = Stack(settings, broker=own_broker)
    bus = BusSettings(bootstrap_servers=own_broker.bootstrap)
    try:
        stack.up()
        stack.up()  # idempotent: everything already runs
        assert all(pid is not None for pid in stack.status().values())

        tasks = [{"id": f"q{i}", "question": f"What is {i}?", "answer": str(i)} for i in range(4)]
        (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
        (tmp_path / "held_out.jsonl").write_text("".join(json.dumps(t) + "\n" for t in [
            {"id": "h0", "question": "What is x?", "answer": "42"}, {"id": "h1", "question": "What is y?",
                                                                     "answer": "7"}]))
        (tmp_path / "run.yaml").write_text(yaml.safe_dump({
            "run_id": run_id, "dataset": "tasks.jsonl", "group_size": 2, "concurrency": 4, "timeout_s": 120,
            "harness": {"command": [sys.executable, str(AGENT), "--max-turns", "2", "--max-tokens", "16"],
                        "setup": ["mkdir", "-p", "work/{rollout_id}"], "workdir": "."},
            "sandbox": {"workdir": "work/{rollout_id}", "read_only": [str(AGENT)]},
            "validation": {"dataset": "held_out.jsonl", "every": 2}}))
        controller = ControllerSettings(gateway_url=settings.gateway_url, gateway_admin_key=settings.admin_key,
                                        gateway_secret=settings.secret, bus=bus)
        openai_agent = asyncio.run(run(load_config(tmp_path / "run.yaml"), controller))
        held_out = {r for r, s in openai_agent.rollouts.items() if s.started.validation}
        assert len(openai_agent.rollouts) == 10 and all(s.finished for s in openai_agent.rollouts.values())
        assert len(held_out) == 2 and openai_agent.rounds[0].reported is not None  # version 0, before any update
        mini = asyncio.run(run(load_config(mini_swe_agent_run(tmp_path / "mini", run_id)), controller))
        mini_ids = set(mini.rollouts) - set(openai_agent.rollouts)  # one run: the second view holds the first
        assert len(mini_ids) == 4, mini.rollouts
        for rid in mini_ids:
            finished = mini.rollouts[rid].finished
            assert finished and (finished.status, finished.reward) == ("succeeded", 0.0), finished

        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:  # six groups, B=2: three updates
            latest = checkpoint.latest(settings.run_dir / "checkpoints" / run_id)
            if latest is not None and checkpoint.load_state(latest).version >= 3:
                break
            time.sleep(0.5)
        assert latest is not None, stack.logs
        state = checkpoint.load_state(latest)
        assert state.version == 3 and {f"{run_id}.file-a", f"{run_id}.file-b"} <= set(state.trained), state.trained

        admin = httpx.get(f"{settings.gateway_url}/admin/state",
                          headers={"authorization": f"Bearer {settings.admin_key}"}).json()
        assert admin["weight_version"] == 3 and not admin["paused"]
        events = asyncio.run(control_events(bus, run_id))
        for kind in (UpdateRequested, GatewayDrained, WeightVersionPublished):
            assert sorted(e.version for e in events if isinstance(e, kind)) == [1, 2, 3], kind

        stored = asyncio.run(unique_groups(bus, run_id))
        replayed_events, rebuilt = asyncio.run(replay(bus, run_id, Policy()))
        assert len(stored) == 6 and content_hash(rebuilt) == content_hash(stored)
        assert not held_out & {r.rollout_id for g in stored for r in g.rollouts}  # validated, never a sample
        greedy = [c for c in replayed_events if isinstance(c, ModelCall) and c.rollout_id in held_out]
        assert greedy and all(c.sampling.temperature == 0.0 and c.weight_version == 0 for c in greedy)
        calls = [e for e in replayed_events if isinstance(e, ModelCall)]
        assert {c.rollout_id for c in calls} == set(mini.rollouts)
        per_mini_rollout = [sum(c.rollout_id == rid for c in calls) for rid in mini_ids]
        assert per_mini_rollout == [2] * 4  # step_limit 2: two calls each, then mini-swe-agent stops
    finally:
        stack.down(keep_kafka=True)
    assert all(pid is None for pid in stack.status().values())

    results = run_queries(connect(f"chdb://{settings.run_dir / 'clickhouse'}"), run_id)  # the sink's tables
    columns, rows = results["calls_per_rollout"]
    assert sum(r[columns.index("rollouts")] for r in rows) == 14  # the two validation rollouts' calls too
    columns, rows = results["validation_per_version"]
    assert [(r[columns.index("version")], r[columns.index("setting")], r[columns.index("rollouts")])
            for r in rows] == [(0, "greedy", 2)]
    assert len(results["updates"][1]) == 3
    assert os.path.exists(stack.logs / "trainer.log")
