"""One contract for every runner: local processes (spawned, or forked from a zygote that preloaded modules), and
Kubernetes Jobs on FakeKubeAPI (a fake API server)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from controller.config import Kubernetes
from controller.errors import LaunchError
from controller.runners.base import Exit, JobSpec, ProcessSpec, Runner, Spec
from controller.runners.kubernetes import KubernetesRunner, build_job, job_name
from controller.runners.local import LocalRunner

IGNORE_TERM_AND_SLEEP = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"



MakeRunner = Callable[[float], Runner[Any]]


@pytest.fixture(params=["local", "local-preload", "kubernetes"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make_runner(kind: str, request: pytest.FixtureRequest) -> MakeRunner:
    run_id = f"run-{uuid.uuid4().hex[:6]}"

    def make(timeout_s: float) -> Runner[Any]:
        if kind == "local":
            return LocalRunner(grace_s=1.0)
        if kind == "local-preload":
            return LocalRunner(grace_s=1.0, preload=["json", "decimal"])
        url = request.getfixturevalue("kube_api")
        return KubernetesRunner(Kubernetes(host=url, creations_per_s=50), run_id, timeout_s, grace_s=1.0)

    make.run_id = run_id  # type: ignore[attr-defined]
    make.kind = kind  # type: ignore[attr-defined]
    return make


def _shared(tmp_path: Path, run_id: str, rollout: str | None) -> dict[str, Any]:
    rid = rollout or f"{run_id}.task.r0.a0-{uuid.uuid4().hex[:4]}"
    return {"rollout_id": rid, "run_id": run_id, "task_id": "task", "attempt": 0,
            "env": {"TETHER_ROLLOUT_ID": rid, "PATH": os.environ["PATH"]}, "log_path": tmp_path / f"{rid}.log"}


def process_spec(tmp_path: Path, run_id: str, argv: list[str], rollout: str | None = None) -> ProcessSpec:
    return ProcessSpec(**_shared(tmp_path, run_id, rollout), argv=argv)


def spec(tmp_path: Path, make: MakeRunner, argv: list[str], rollout: str | None = None) -> ProcessSpec | JobSpec:
    """The kind of spec the runner `make` makes runs: a process for the local runners, a Job for Kubernetes."""
    run_id: str = make.run_id  # type: ignore[attr-defined]
    if make.kind != "kubernetes":  # type: ignore[attr-defined]
        return process_spec(tmp_path, run_id, argv, rollout)
    job = {"apiVersion": "batch/v1", "kind": "Job", "spec": {"template": {"spec": {
        "containers": [{"name": "harness", "image": "python:3.11", "command": argv}]}}}}
    return JobSpec(**_shared(tmp_path, run_id, rollout), job=job)


async def run(runner: Runner[Any], s: Spec, timeout_s: float = 30) -> Exit:
    try:
        await runner.start(s)
        return await runner.wait(s, timeout_s)
    finally:
        await runner.close()


async def test_reports_the_exit_code_and_keeps_the_output(make_runner: MakeRunner, tmp_path: Path) -> None:
    code = "import os, sys; print('hello from', os.environ['TETHER_ROLLOUT_ID']); sys.exit(3)"
    s = spec(tmp_path, make_runner, [sys.executable, "-c", code])
    outcome = await run(make_runner(30), s)
    assert (outcome.status, outcome.exit_code) == ("exited", 3)
    assert f"hello from {s.rollout_id}" in s.log_path.read_text()


async def test_success_is_exit_code_zero(make_runner: MakeRunner, tmp_path: Path) -> None:
    outcome = await run(make_runner(30), spec(tmp_path, make_runner, [sys.executable, "-c", "pass"]))
    assert (outcome.status, outcome.exit_code) == ("exited", 0)


async def test_a_harness_past_its_timeout_is_stopped(make_runner: MakeRunner, tmp_path: Path) -> None:
    started = time.monotonic()
    outcome = await run(make_runner(1.0), spec(tmp_path, make_runner, [sys.executable, "-c", IGNORE_TERM_AND_SLEEP]),
                        timeout_s=1.0)
    assert outcome.status == "timeout"
    assert time.monotonic() - started < 20  # not the harness's 60 s: it was killed despite ignoring SIGTERM


async def test_cancel_stops_it(make_runner: MakeRunner, tmp_path: Path) -> None:
    runner = make_runner(60)
    s = spec(tmp_path, make_runner, [sys.executable, "-c", IGNORE_TERM_AND_SLEEP])
    try:
        await runner.start(s)
        waiting = asyncio.create_task(runner.wait(s, 60))
        await asyncio.sleep(0.5)
        await runner.cancel(s)
        outcome = await asyncio.wait_for(waiting, 20)
    finally:
        await runner.close()
    assert outcome.status == "cancelled"


async def test_a_harness_that_cannot_start_is_an_infrastructure_failure(make_runner: MakeRunner,
                                                                        tmp_path: Path) -> None:
    """Either `start` refuses (LaunchError) or `wait` reports it lost: the controller retries both."""
    try:
        outcome = await run(make_runner(30), spec(tmp_path, make_runner, [str(tmp_path / "no-such-harness")]))
    except LaunchError as exc:
        assert "no-such-harness" in str(exc)
    else:
        assert outcome.status == "lost" and outcome.reason and "could not start" in outcome.reason


async def test_a_new_runner_finds_a_running_harness_and_its_exit(make_runner: MakeRunner, tmp_path: Path) -> None:
    """What a restarted controller does: attach to what the dead one started, and learn how it ended."""
    s = spec(tmp_path, make_runner, [sys.executable, "-c", "import sys, time; time.sleep(1.5); sys.exit(5)"])
    first = make_runner(30)
    await first.start(s)
    await first.close()  # the controller that started it is gone
    second = make_runner(30)
    try:
        assert await second.attach(s)
        outcome = await second.wait(s, 30)
        assert not await second.attach(spec(tmp_path, make_runner, [sys.executable, "-c", "pass"]))
    finally:
        await second.close()
    assert (outcome.status, outcome.exit_code) == ("exited", 5)


def test_jobs_carry_the_rollout(tmp_path: Path) -> None:
    env = {"OPENAI_API_KEY": "tr1.x.y", "TETHER_ROLLOUT_ID": "Run.Task/1.r0.a2"}
    template: dict[str, Any] = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"labels": {"team": "agents"}},
                "spec": {"backoffLimit": 6, "template": {"spec": {"restartPolicy": "OnFailure",
                                                                 "initContainers": [{"name": "i", "image": "x"}],
                                                                 "containers": [
                    {"name": "a", "image": "x", "env": [{"name": "OPENAI_API_KEY", "value": "stale"},
                                                        {"name": "KEEP", "value": "1"}]}]}}}}
    s = JobSpec(rollout_id="Run.Task/1.r0.a2", run_id="Run", task_id="Task/1", attempt=2, env=env,
                log_path=tmp_path / "log", job=template)
    job = build_job(s, "agents", timeout_s=90.5, ttl_s=600)
    assert job["metadata"]["name"] == job_name(s.rollout_id) and len(job["metadata"]["name"]) <= 63
    assert job["metadata"]["labels"]["team"] == "agents"
    assert job["metadata"]["labels"]["tether.dev/attempt"] == "2"
    assert job["metadata"]["annotations"]["tether.dev/rollout-id"] == "Run.Task/1.r0.a2"
    assert job["spec"]["backoffLimit"] == 0 and job["spec"]["activeDeadlineSeconds"] == 91
    assert job["spec"]["ttlSecondsAfterFinished"] == 600
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert {e["name"]: e["value"] for e in pod["containers"][0]["env"]} == {"KEEP": "1", **env}
    assert {e["name"]: e["value"] for e in pod["initContainers"][0]["env"]} == env  # a harness may run there
    assert template["spec"]["backoffLimit"] == 6  # the template itself is untouched
    assert job_name("a.b") != job_name("a-b")


async def test_a_preloaded_harness_runs_as_its_own_program(tmp_path: Path) -> None:
    """Forked from the zygote: the module is already imported, yet argv, __main__, sys.path[0], the working
    directory and the environment are the rollout's, its own subprocesses can be waited on, and a death by
    signal reads as the shell reports it (128 + N)."""
    (tmp_path / "lib.py").write_text("VALUE = 7\n")
    (tmp_path / "work").mkdir()
    (tmp_path / "agent.py").write_text(
        "import os, subprocess, sys\n"
        "import lib\n"
        "preloaded = 'decimal' in sys.modules\n"
        "child = subprocess.run(['sh', '-c', 'exit 4']).returncode\n"
        "print(__name__, sys.argv, preloaded, lib.VALUE, child, os.getcwd(), os.environ['TETHER_ROLLOUT_ID'])\n"
        "if sys.argv[1] == 'die':\n"
        "    os.kill(os.getpid(), 9)\n"
        "sys.exit(child)\n")
    outcomes = []
    for word in ("live", "die"):
        s = process_spec(tmp_path, "preload", [sys.executable, str(tmp_path / "agent.py"), word])
        s = dataclasses.replace(s, workdir=tmp_path / "work")
        outcomes.append((await run(LocalRunner(grace_s=1.0, preload=["decimal"]), s), s))
    (live, s), (died, _) = outcomes
    assert (live.status, live.exit_code) == ("exited", 4) and (died.status, died.exit_code) == ("exited", 137)
    assert s.log_path.read_text().split() == [
        "__main__", f"['{tmp_path / 'agent.py'}',", "'live']", "True", "7", "4", str(tmp_path / "work"),
        s.rollout_id]


async def test_a_module_that_cannot_be_preloaded_is_a_launch_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(LaunchError, match="import no_such_module_here: ModuleNotFoundError"):
        await run(LocalRunner(preload=["no_such_module_here"]),
                  process_spec(tmp_path, "preload", [sys.executable, "-c", "pass"]))


def test_each_runner_is_given_its_own_kind_of_spec(tmp_path: Path) -> None:
    """A local run gets argv, workdir and the controller's environment beneath the run's; a Job gets its filled
    template and only the run's environment (the pod has its own)."""
    from controller.config import Harness
    from controller.main import job_specs, process_specs
    from controller.placeholders import fill_all

    base = Spec(rollout_id="r.t.r0.a0", run_id="r", task_id="t", attempt=0, env={"TETHER_ROLLOUT_ID": "r.t.r0.a0"},
                log_path=tmp_path / "r.t.r0.a0.log")
    values = {"rollout_id": base.rollout_id, "run_id": "r", "task_id": "t", "group_id": "g", "attempt": 0}
    task = {"id": "t", "prompt": "hi"}

    def fill_in(obj: Any) -> Any:
        return fill_all(obj, values, task)

    local = process_specs(Harness(command=["agent", "{task.prompt}", "{rollout_id}"], workdir=tmp_path))(base, fill_in)
    assert (local.argv, local.workdir, local.rollout_id) == (["agent", "hi", "r.t.r0.a0"], tmp_path, "r.t.r0.a0")
    assert local.env == {**os.environ, "TETHER_ROLLOUT_ID": "r.t.r0.a0"}
    template = {"kind": "Job", "metadata": {"labels": {"task": "{task_id}"}}}
    job = job_specs(template)(base, fill_in)
    assert job.job == {"kind": "Job", "metadata": {"labels": {"task": "t"}}} and job.env == base.env
    assert template["metadata"]["labels"]["task"] == "{task_id}"  # type: ignore[index]
