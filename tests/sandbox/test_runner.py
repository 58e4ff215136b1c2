"""Sandboxed rollouts through the controller's local runner: a restart finds them, a timeout stops them whole."""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from controller.config import Harness, Sandbox
from controller.main import process_specs
from controller.runners.base import ProcessSpec, Spec
from controller.runners.local import LocalRunner
from infra.sandbox.policy import UIDS, Policy
from tests.sandbox.support import Server


def _sandboxed_spec(tmp_path: Path, gateway: Server, code: str) -> ProcessSpec:
    """A rollout's spec as the controller makes it for a sandboxed Python harness."""
    rid = f"r.t.r0.a{uuid.uuid4().hex[:6]}"
    (tmp_path / "work" / rid).mkdir(parents=True)
    base = Spec(rollout_id=rid, run_id="r", task_id="t", attempt=0, log_path=tmp_path / "logs" / f"{rid}.log",
                env={"TETHER_ROLLOUT_ID": rid})
    harness = Harness(command=[sys.executable, "-c", code], workdir=tmp_path)
    return process_specs(harness, Sandbox(workdir="work/{rollout_id}"), f"http://127.0.0.1:{gateway.port}")(
        base, lambda obj: json.loads(json.dumps(obj).replace("{rollout_id}", rid)))


async def test_a_restarted_controller_finds_a_sandboxed_rollout_and_its_exit(
        tmp_path: Path, servers: tuple[Server, Server]) -> None:
    spec = _sandboxed_spec(tmp_path, servers[0], "import sys, time; open('out', 'w').write('x'); time.sleep(2); "
                                                 "sys.exit(5)")
    first = LocalRunner(grace_s=1.0)
    await first.start(spec)
    await first.close()  # the controller that started it is gone
    second = LocalRunner(grace_s=1.0)
    try:
        assert await second.attach(spec)
        outcome = await second.wait(spec, 60)
    finally:
        await second.close()
    assert (outcome.status, outcome.exit_code) == ("exited", 5), spec.log_path.read_text()
    assert (tmp_path / "work" / spec.rollout_id / "out").read_text() == "x"  # copied back


async def test_a_sandboxed_rollout_past_its_time_is_stopped_whole(tmp_path: Path,
                                                                  servers: tuple[Server, Server]) -> None:
    """A harness that ignores SIGTERM and leaves a process of its own: the runner's SIGKILL after the grace period
    ends the sandbox and everything in it."""
    code = ("import os, signal, subprocess, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "subprocess.Popen(['sleep', '300'], start_new_session=True); open('ready', 'w').close(); time.sleep(300)")
    spec = _sandboxed_spec(tmp_path, servers[0], code)
    runner = LocalRunner(grace_s=1.0)
    try:
        await runner.start(spec)
        assert await _until(lambda: len(_sandbox_processes()) >= 3)  # the harness, its sleep, inside.py at least
        outcome = await runner.wait(spec, 3)
    finally:
        await runner.close()
    assert outcome.status == "timeout"
    assert await _until(lambda: not _sandbox_processes()), _sandbox_processes()


async def _until(condition: Callable[[], bool], timeout_s: float = 15) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():  # processes of other users: nothing to wait on but polling
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


def _sandbox_processes() -> list[int]:
    """Processes of the users the launcher hands out (none of the machine's own)."""
    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            uid = int(next(line for line in status.read_text().splitlines() if line.startswith("Uid:")).split()[1])
        except (OSError, StopIteration, ValueError):
            continue
        if Policy.model_fields["uid"].default <= uid < Policy.model_fields["uid"].default + UIDS:
            found.append(int(status.parent.name))
    return found
