"""examples/swe end to end: mini-swe-agent, Claude Code and Codex, unmodified, each in its rollouts' sandboxes, on
a task built from toolz, through the gateway (the scripted engine), the controller and the processors. One
rollout of the group applies the real fix (reward 1), the other edits the failing tests (reward 0), and the task
group forms with both. The agent's command checks its sandbox first: no tasks folder, no other rollout's copy,
no Tether source, not root."""

from __future__ import annotations

import base64
import json
import os
import shutil
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from controller.config import load_config
from controller.main import run
from schemas.settings import BusSettings
from swe.build import load_instances
from tests.conftest import scripted
from tests.fakes.vllm import tool_call
from tests.test_controller_examples import controller_settings
from tests.test_harness_clis import NPM_BIN, group_of, in_place
from tests.test_processors import processor

EXAMPLES = Path(__file__).parent.parent / "examples"


Replies = Callable[[str], tuple[str, ...]]
#: each harness's run file, and what the scripted model answers in its own tools: the command, then "done"
HARNESSES: dict[str, tuple[str, Replies]] = {
    "mini-swe-agent": ("run.yaml", lambda command: (
        tool_call("bash", {"command": command}),
        tool_call("bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}))),
    "claude-code": ("run-claude-code.yaml", lambda command: (
        tool_call("Bash", {"command": command, "description": "Fix the bug"}), "Done.")),
    "codex": ("run-codex.yaml", lambda command: (tool_call("exec_command", {"cmd": command}), "Done.")),
}


@pytest.fixture(scope="module", params=list(HARNESSES))
def harness_run(request: pytest.FixtureRequest, bus: BusSettings,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A run (and the processors that group it) per harness."""
    run_id = f"swe-{request.param}-{uuid.uuid4().hex[:8]}"
    with processor(bus, tmp_path_factory.mktemp("swe-processors"), run_id, f"{run_id}-processors"):
        yield request.param, run_id


async def test_the_example_trains_on_built_tasks_a_fix_scores_1_and_a_hack_0(
        bus: BusSettings, tiny_model: Path, toolz_tasks: Path, tmp_path: Path, harness_run: tuple[str, str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    harness, run_id = harness_run
    run_file, replies_of = HARNESSES[harness]
    examples = tmp_path / "examples"
    shutil.copytree(EXAMPLES / "swe", examples / "swe", ignore=shutil.ignore_patterns("tasks", "work"))
    for other in ("mini_swe_agent", "codex"):
        shutil.copytree(EXAMPLES / other, examples / other, ignore=shutil.ignore_patterns("work"))
    shutil.copytree(toolz_tasks, examples / "swe" / "tasks")
    instance = next(iter(load_instances(toolz_tasks / "private" / "instances.jsonl").values()))
    (examples / "swe" / "tasks" / "tasks.jsonl").write_text(  # one task: one group
        (toolz_tasks / "tasks.jsonl").read_text().splitlines()[0] + "\n")
    gold = base64.b64encode(instance.gold_patch.encode()).decode()  # what the honest rollout "works out"
    test_file = instance.fail_to_pass[0].split("::")[0]
    hack = "".join(f"\\n\\ndef {t.split('::')[-1]}():\\n    assert True\\n"
                   for t in instance.fail_to_pass if t.startswith(test_file))
    # in its sandbox: no tasks folder, no other rollout's copy, no Tether source, an unprivileged user
    command = (f'test ! -e ../../tasks && test "$(ls ..)" = "$TETHER_ROLLOUT_ID" && '
               f'test ! -e {EXAMPLES.parent / "swe" / "grade.py"} && test ! -e {EXAMPLES / "swe"} && '
               f'test "$(id -u)" != 0 && case "$TETHER_ROLLOUT_ID" in '
               f"*.r0.a0) echo {gold} | base64 -d | git apply ;; *) printf '{hack}' >> {test_file} ;; esac")
    # `tether` and `mini` are installed beside this interpreter; the CLIs by `make harnesses`
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{NPM_BIN}:{os.environ['PATH']}")
    config = in_place(load_config(examples / "swe" / run_file)).model_copy(update={"run_id": run_id})
    with scripted(bus, tiny_model, tmp_path, replies_of(command), run_id) as gw:
        view = await run(config, controller_settings(bus, gw))

    rewards, logs = {}, ""
    for rid, state in view.rollouts.items():
        log = (config.run_dir / f"{rid}.log").read_text(errors="replace")
        assert state.finished and state.finished.status == "succeeded", log[-3000:]
        rewards[rid.rsplit(".", 2)[-2]] = state.finished.reward
        logs += f"{rid}:\n{log[-2000:]}\n"
    assert rewards == {"r0": 1.0, "r1": 0.0}, logs
    hacked = examples / "swe" / "work" / next(r for r in view.rollouts if ".r1." in r) / test_file
    assert "assert True" in hacked.read_text()  # the hack was made, and graded away

    group = await group_of(bus, run_id, instance.id)
    assert not group.partial and sorted(r.reward for r in group.rollouts) == [0.0, 1.0]
    trained = [r for r in group.rollouts if r.reward == 1.0]
    assert trained and trained[0].segments and any(any(s.loss_mask) for s in trained[0].segments)
    assert json.loads(json.dumps(group.task_id)) == instance.id
