"""Claude Code and Codex, the real CLIs from npm, unmodified, run by the controller through the gateway.

The engine is FakeVLLM scripted as the model would act: first a tool call in
each CLI's own tool (Claude Code's `Bash`, Codex's `exec_command`) that writes
the task's file, then a final message. Each CLI runs the tool, sends the result
back on its next call and ends; the reward command finds the file. Then the
record: every call with token ids, each prompt extending the one before (the
model's own turns reused exactly), the task group formed by the processors,
and a replay of the topics equal to it. In both tests the gateway refused no
request of the run (its own count on /metrics): a CLI resends a refused call
without the field at fault and still succeeds, so only that count shows it.

Then each CLI once more on the embedded engine with the tiny model at a 32k
context: its whole prompt (20-30 thousand tokens) goes through prefill and
sampling, and nothing breaks. The random model seldom ends an answer, so most
answers stop at the 48-token limit; each CLI reads that from its own protocol's
stop reason (Anthropic's `max_tokens`, the Responses API's `incomplete`), says
so and exits 1, and the rollout lands in its task group as a dropped failure.
An answer that did end is nonsense: the CLI ends well, with reward 0. Either
way every call is recorded with its token ids.

The CLIs come from `make harnesses` (examples/npm); `make test` installs them.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from controller.config import RunConfig, load_config
from controller.main import run
from schemas.events import ModelCall, TaskGroup
from schemas.samples import unique_groups
from schemas.settings import BusSettings
from stream_processors.grouping import Policy
from stream_processors.pipeline import content_hash
from stream_processors.replay import replay
from tests.conftest import RunningEngine, RunningGateway, gateway, scripted, serve_engine
from tests.fakes.vllm import tool_call
from tests.test_controller_examples import controller_settings
from tests.test_gateway_agents import assert_extends
from tests.test_gateway_hardening import refused_requests
from tests.test_gateway_openai import recorded
from tests.test_processors import processor

EXAMPLES = Path(__file__).parent.parent / "examples"
NPM_BIN = EXAMPLES / "npm" / "node_modules" / ".bin"


@dataclass(frozen=True)
class Cli:
    example: str
    files: tuple[str, ...]
    replies: tuple[str, ...]


CLAUDE_CODE = Cli("claude_code", ("run.yaml",), (
    tool_call("Bash", {"command": "printf hi > hello.txt", "description": "Write the file"}), "Done: hello.txt."))
CODEX = Cli("codex", ("run.yaml", "config.toml"), (
    tool_call("exec_command", {"cmd": "printf hi > hello.txt"}), "Done: hello.txt."))


@pytest.fixture(scope="module")
def cli_run(bus: BusSettings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One run for both CLIs, and the processors that join and group its calls."""
    if not (NPM_BIN / "claude").exists() or not (NPM_BIN / "codex").exists():
        pytest.fail(f"the harness CLIs are not installed in {NPM_BIN}: run `make harnesses`")
    run_id = f"clis-{uuid.uuid4().hex[:8]}"
    with processor(bus, tmp_path_factory.mktemp("cli-processors"), run_id, f"{run_id}-processors"):
        yield run_id


@pytest.mark.parametrize("cli", [CLAUDE_CODE, CODEX], ids=lambda c: c.example)
async def test_the_cli_runs_a_tool_and_its_episode_is_recorded_grouped_and_replayed(
        cli: Cli, cli_run: str, bus: BusSettings, tiny_model: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{NPM_BIN}:{os.environ['PATH']}")
    for name in cli.files:
        shutil.copy(EXAMPLES / cli.example / name, tmp_path / name)
    task = {**json.loads((EXAMPLES / cli.example / "tasks.jsonl").read_text().splitlines()[0])}
    task["id"] = f"{cli.example}-{task['id']}"  # one run for both CLIs: a task of each
    (tmp_path / "tasks.jsonl").write_text(json.dumps(task) + "\n")
    config = in_place(load_config(tmp_path / "run.yaml")).model_copy(update={"run_id": cli_run})
    with scripted(bus, tiny_model, tmp_path, cli.replies, cli_run) as gw:
        view = await run(config, controller_settings(bus, gw))
        assert_none_refused(gw)

    mine = {rid: state for rid, state in view.rollouts.items() if state.started.task_id == task["id"]}
    assert len(mine) == config.group_size == 2  # the view is the run's: the other CLI's rollouts are there too
    for rid, state in mine.items():
        log = (config.run_dir / f"{rid}.log").read_text(errors="replace")
        assert state.finished and (state.finished.status, state.finished.reward) == ("succeeded", 1.0), log[-3000:]
        assert (tmp_path / "work" / rid / "hello.txt").read_text() == "hi"
        calls = sorted((c for c in await recorded(bus, rid, 2) if isinstance(c, ModelCall)), key=lambda c: c.seq)
        assert len(calls) == 2 and all(c.status == "ok" and c.response_token_ids for c in calls), calls
        assert_extends(calls)  # the tool call came back from the CLI as the exact ids the model sampled

    group = await group_of(bus, cli_run, task["id"])
    assert not group.partial and sorted(r.rollout_id for r in group.rollouts) == sorted(mine)
    events, rebuilt = await replay(bus, cli_run, Policy())
    assert content_hash(rebuilt) == content_hash(await unique_groups(bus, cli_run))
    assert {e.rollout_id for e in events if isinstance(e, ModelCall)} >= set(mine)


TRUNCATED = {"claude_code": "exceeded the 48 output token maximum",
             "codex": "Incomplete response returned, reason: max_output_tokens"}


@pytest.fixture(scope="module")
def long_context_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningEngine, Path]]:
    """The embedded engine on the tiny model at a 32k context; requests that set no limit (Codex's) get 48 tokens."""
    from tether.tiny_model import init_tiny

    folder = tmp_path_factory.mktemp("tiny-32k")
    model = init_tiny(folder / "model", seed=0, context=32768)
    with serve_engine(model, folder / "engine.log", TETHER_ENGINE_DEFAULT_MAX_TOKENS="48") as engine:
        yield engine, model


@pytest.mark.parametrize("cli", [CLAUDE_CODE, CODEX], ids=lambda c: c.example)
async def test_the_cli_s_whole_prompt_goes_through_the_tiny_model_and_is_recorded(
        cli: Cli, cli_run: str, bus: BusSettings, long_context_engine: tuple[RunningEngine, Path], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    engine, model = long_context_engine
    monkeypatch.setenv("PATH", f"{NPM_BIN}:{os.environ['PATH']}")
    for name in cli.files:
        shutil.copy(EXAMPLES / cli.example / name, tmp_path / name)
    task = {**json.loads((EXAMPLES / cli.example / "tasks.jsonl").read_text().splitlines()[0])}
    task["id"] = f"tiny-{cli.example}-{task['id']}"
    (tmp_path / "tasks.jsonl").write_text(json.dumps(task) + "\n")
    config = in_place(load_config(tmp_path / "run.yaml"))
    harness = config.harness.model_copy(update={"env": {**config.harness.env, "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "48"}})
    config = config.model_copy(update={"run_id": cli_run, "group_size": 1, "harness": harness})
    with gateway(bus, engine, model, tmp_path / "gateway.log", cli_run) as gw:
        view = await run(config, controller_settings(bus, gw))
        assert_none_refused(gw)

    [(rid, state)] = [(rid, s) for rid, s in view.rollouts.items() if s.started.task_id == task["id"]]
    log = (config.run_dir / f"{rid}.log").read_text(errors="replace")
    calls = sorted((c for c in await recorded(bus, rid, 1) if isinstance(c, ModelCall)), key=lambda c: c.seq)
    assert calls and all(c.status == "ok" and 1 <= len(c.response_token_ids) <= 48 for c in calls), calls
    assert len(calls[0].prompt_token_ids) > 15_000  # the CLI's real system prompt and tools, all of it
    group = await group_of(bus, cli_run, task["id"])
    assert state.finished, log[-3000:]
    if calls[-1].finish_reason == "length":
        assert state.finished.status == "failed", log[-3000:]
        assert TRUNCATED[cli.example] in log, log[-3000:]  # the CLI's own words: its protocol said "cut"
        assert not group.rollouts and [(d.rollout_id, d.status) for d in group.dropped] == [(rid, "failed")]
    else:
        assert (state.finished.status, state.finished.reward) == ("succeeded", 0.0), log[-3000:]
        assert [(r.rollout_id, r.reward) for r in group.rollouts] == [(rid, 0.0)]


def in_place(config: RunConfig) -> RunConfig:
    """The example's run file copied away from examples/: its sandbox's CLIs where `make harnesses` put them."""
    read_only = [str(NPM_BIN.parent) if p == "../npm/node_modules" else p for p in config.sandbox.read_only]
    return config.model_copy(update={"sandbox": config.sandbox.model_copy(update={"read_only": read_only})})


def assert_none_refused(gw: RunningGateway) -> None:
    """No request of the run got an error, by the gateway's own count: a CLI that retries a refused call without
    the field at fault still ends well, but its first call went unrecorded and it acted unlike in production."""
    refused = refused_requests(gw)
    lines = [line for line in gw.log.read_text(errors="replace").splitlines() if "refused " in line]
    assert not refused, (refused, lines[-10:])


async def group_of(bus: BusSettings, run_id: str, task_id: str, timeout_s: float = 120) -> TaskGroup:
    deadline = time.monotonic() + timeout_s
    while True:
        found = [g for g in await unique_groups(bus, run_id) if g.task_id == task_id]
        if found or time.monotonic() > deadline:
            assert found, f"no task group for {task_id} within {timeout_s} s"
            return found[0]
        await asyncio.sleep(1.0)
