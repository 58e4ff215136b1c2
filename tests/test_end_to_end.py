"""The whole stack on its own broker: `tether up`, an unmodified agent run by the controller, updates that pause and
resume the gateway, replay equal to what was trained, analytics rows, `tether down` leaving nothing running."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

import httpx
import yaml

from controller.config import load_config
from controller.main import run
from controller.settings import ControllerSettings
from infra.kafka.launcher import KafkaBroker
from infra.processes import free_port
from schemas.events import GatewayDrained, ModelCall, UpdateRequested, WeightVersionPublished
from schemas.samples import unique_groups
from schemas.settings import BusSettings
from stream_processors.analytics import run_queries
from stream_processors.grouping import Policy
from stream_processors.pipeline import content_hash
from stream_processors.replay import replay
from stream_processors.sink import connect
from tests.test_trainer_loop import control_events
from tether.stack import Stack, StackSettings
from trainer import checkpoint

AGENT = Path(__file__).parent.parent / "examples" / "openai_agent.py"


def test_the_stack_trains_an_unmodified_agent(own_broker: KafkaBroker, tiny_model: Path, tmp_path: Path) -> None:
    run_id = "e2e"
    settings = StackSettings(run_id=run_id, home=tmp_path / "home", model=tiny_model, engine_port=free_port(),
                             gateway_port=free_port(), trainer={"batch_groups": 2, "max_updates": 2,
                                                                "zero_variance": "keep", "max_staleness": 100})
    stack = Stack(settings, broker=own_broker)
    bus = BusSettings(bootstrap_servers=own_broker.bootstrap)
    try:
        stack.up()
        stack.up()  # idempotent: everything already runs
        assert all(pid is not None for pid in stack.status().values())

        tasks = [{"id": f"q{i}", "question": f"What is {i}?", "answer": str(i)} for i in range(4)]
        (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
        (tmp_path / "run.yaml").write_text(yaml.safe_dump({
            "run_id": run_id, "dataset": "tasks.jsonl", "group_size": 2, "concurrency": 4, "timeout_s": 120,
            "harness": {"command": [sys.executable, str(AGENT), "--max-turns", "2", "--max-tokens", "16"]}}))
        view = asyncio.run(run(load_config(tmp_path / "run.yaml"), ControllerSettings(
            gateway_url=settings.gateway_url, gateway_admin_key=settings.admin_key, gateway_secret=settings.secret,
            bus=bus)))
        assert len(view.rollouts) == 8 and all(s.finished for s in view.rollouts.values())

        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:  # four groups, B=2: two updates
            latest = checkpoint.latest(settings.run_dir / "checkpoints" / run_id)
            if latest is not None and checkpoint.load_state(latest).version >= 2:
                break
            time.sleep(0.5)
        assert latest is not None and checkpoint.load_state(latest).version == 2, stack.logs

        admin = httpx.get(f"{settings.gateway_url}/admin/state",
                          headers={"authorization": f"Bearer {settings.admin_key}"}).json()
        assert admin["weight_version"] == 2 and not admin["paused"]
        events = asyncio.run(control_events(bus, run_id))
        for kind in (UpdateRequested, GatewayDrained, WeightVersionPublished):
            assert sorted(e.version for e in events if isinstance(e, kind)) == [1, 2], kind

        stored = asyncio.run(unique_groups(bus, run_id))
        replayed_events, rebuilt = asyncio.run(replay(bus, run_id, Policy()))
        assert len(stored) == 4 and content_hash(rebuilt) == content_hash(stored)
        calls = [e for e in replayed_events if isinstance(e, ModelCall)]
        assert len(calls) >= 8 and {c.rollout_id for c in calls} == set(view.rollouts)
    finally:
        stack.down(keep_kafka=True)
    assert all(pid is None for pid in stack.status().values())

    results = run_queries(connect(f"chdb://{settings.run_dir / 'clickhouse'}"), run_id)  # the sink's tables
    columns, rows = results["calls_per_rollout"]
    assert sum(r[columns.index("rollouts")] for r in rows) == 8
    assert len(results["updates"][1]) == 2
    assert os.path.exists(stack.logs / "trainer.log")
