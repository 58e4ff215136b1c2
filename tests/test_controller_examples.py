"""The examples run unmodified under the controller: the openai-SDK agent, and mini-swe-agent."""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from controller.config import load_config
from controller.main import run
from controller.settings import ControllerSettings
from schemas.settings import BusSettings
from tests.conftest import ADMIN_KEY, SECRET, RunningGateway, scripted

EXAMPLES = Path(__file__).parent.parent / "examples"
# What a model driving mini-swe-agent would say: one command, then the end-of-task command.
MINI_REPLIES = ['I will create the file.\n<tool_call>\n{"name": "bash", "arguments": '
                '{"command": "printf hi > hello.txt"}}\n</tool_call>',
                'Done.\n<tool_call>\n{"name": "bash", "arguments": {"command": '
                '"echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}}\n</tool_call>']


def controller_settings(bus: BusSettings, gw: RunningGateway) -> ControllerSettings:
    return ControllerSettings(gateway_url=gw.url, gateway_admin_key=ADMIN_KEY, gateway_secret=SECRET, bus=bus)


async def test_the_openai_agent_example(bus: BusSettings, scripted_gateway: RunningGateway, tmp_path: Path,
                                        run_id: str) -> None:
    (tmp_path / "tasks.jsonl").write_text(json.dumps({"id": "q1", "question": "What is x?", "answer": "42"}) + "\n")
    (tmp_path / "run.yaml").write_text(yaml.safe_dump({
        "run_id": run_id, "dataset": "tasks.jsonl", "group_size": 2, "timeout_s": 60,
        "harness": {"command": [sys.executable, str(EXAMPLES / "openai_agent.py"), "--max-turns", "3"],
                    "setup": ["mkdir", "-p", "work/{rollout_id}"], "workdir": "."},
        "sandbox": {"workdir": "work/{rollout_id}", "read_only": [str(EXAMPLES / "openai_agent.py")]}}))
    view = await run(load_config(tmp_path / "run.yaml"), controller_settings(bus, scripted_gateway))
    assert len(view.rollouts) == 2
    for state in view.rollouts.values():
        # The scripted model looks a word up and then talks instead of submitting: reward 0, posted by the agent.
        assert state.finished and (state.finished.status, state.finished.reward) == ("succeeded", 0.0), \
            state.finished


@pytest.fixture(scope="module")
def mini_gateway(bus: BusSettings, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[RunningGateway]:
    with scripted(bus, tiny_model, tmp_path_factory.mktemp("mini"), MINI_REPLIES) as gw:
        yield gw


async def test_mini_swe_agent_example(bus: BusSettings, mini_gateway: RunningGateway, tmp_path: Path,
                                      run_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")  # `mini` is installed here
    for name in ("run.yaml", "tether.yaml", "tasks.jsonl"):
        shutil.copy(EXAMPLES / "mini_swe_agent" / name, tmp_path / name)
    config = load_config(tmp_path / "run.yaml").model_copy(update={"run_id": run_id, "group_size": 1})
    view = await run(config, controller_settings(bus, mini_gateway))
    (state,) = view.rollouts.values()
    log = (config.run_dir / f"{state.started.rollout_id}.log").read_text(errors="replace")
    assert state.finished and (state.finished.status, state.finished.reward) == ("succeeded", 1.0), log[-3000:]
    assert (tmp_path / "work" / state.started.rollout_id / "hello.txt").read_text() == "hi"
