"""A coding task's pod, its three steps run in their own images (infra/images: tether-swe-tasks, tether-swe-agent)
as examples/swe/job-template.yaml fills them: the checkout into a folder shared as the pod's emptyDir; the real
mini-swe-agent in the agent's image, calling a gateway on the host; the grade with the working copy read-only.
No cluster here: podman runs each step with the pod's user, mounts (the emptyDir /tmp a tmpfs), read-only root
filesystem, dropped capabilities and `allowPrivilegeEscalation: false`.

What it holds: the agent's container has no tasks, no grading data and no Tether to read; the grade runs the
change's tests in its jail there (hidden, isolated), an honest fix scores 1 and edited tests 0, and the
controller's reward command reads it from the grade's output. Needs podman (skipped, saying why, without it).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.config import load_config
from controller.rewards import parse_reward
from infra.images.build import CONTAINERFILE, ImageError, build, limits, version
from infra.images.roles import MINI_CONFIG, STEP_IMAGES, SWE_AGENT, SWE_TASKS, TASKS_DIR, USER_ID
from schemas.settings import BusSettings
from swe.build import Instance, load_instances
from tests.conftest import RunningGateway, scripted
from tests.fakes.vllm import tool_call
from tests.test_images import _missing
from tests.test_swe_kubernetes import EXAMPLE, pod_of

TAG = "test"


def probe(names: set[str]) -> str:
    """The agent's first command: what it can find that it must not see, written to /work/seen (the task's
    folder, its grading data, Tether's code, and any file named as those the fix changes, with its hash)."""
    named = " -o ".join(f"-name {name}" for name in sorted(names))
    return (f"{{ test -e {TASKS_DIR} && echo 'tasks: visible'; "
            "find / -xdev \\( -name instances.jsonl -o -name tasks.jsonl -o -name build.json \\) 2>/dev/null "
            "| sed 's/^/grading data: /'; "
            "python -c 'import swe, tether' 2>/dev/null && echo 'tether: importable'; "
            f"find / -xdev -path /work -prune -o -type f \\( {named} \\) -exec sha256sum {{}} + 2>/dev/null "
            "| sed 's/^/same name: /'; id -u; } > /work/seen")


@pytest.fixture(scope="module")
def images(toolz_tasks: Path) -> dict[str, str]:
    missing = _missing()
    if missing is not None:
        pytest.skip(f"the images cannot be built here: {missing}")
    try:
        build(STEP_IMAGES, tag=TAG, tasks=toolz_tasks)
    except ImageError as exc:
        pytest.fail(f"the coding task's images did not build: {exc}")
    return {image.name: f"{image.image}:{TAG}" for image in STEP_IMAGES}


def test_the_job_template_runs_the_images_the_build_makes_with_their_paths() -> None:
    """The template names the images `make images` tags, and the paths and user they were built with."""
    template = yaml.safe_load((EXAMPLE.parent / "job-template.yaml").read_text())["spec"]["template"]["spec"]
    checkout, agent = template["initContainers"]
    (grade,) = template["containers"]
    assert checkout["image"] == grade["image"] == f"{SWE_TASKS.image}:{version()}"
    assert agent["image"] == f"{SWE_AGENT.image}:{version()}"
    assert template["securityContext"]["runAsUser"] == USER_ID
    for step in (checkout, grade):
        assert step["command"][step["command"].index("--tasks") + 1] == TASKS_DIR
    assert agent["command"][agent["command"].index("/etc/tether/mini.yaml")] == MINI_CONFIG


def _podman(image: str, container: dict[str, Any], work: Path, *, network: str = "none",
            env: dict[str, str] | None = None, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    """One step of the pod, as the template has it: its command in its image, as the pod's user, the working copy
    at /work (read-only where its mount is), its securityContext's privileges and /proc."""
    mount, *scratch = container["volumeMounts"]
    assert mount["mountPath"] == "/work" and all(m["name"] == "tmp" for m in scratch)
    security = container.get("securityContext") or {}
    args = ["podman", "run", "--rm", "--network", network, *limits(), "--user", f"{USER_ID}:{USER_ID}",
            "--volume", f"{work}:/work{':ro' if mount.get('readOnly') else ''}"]
    args += [arg for m in scratch for arg in ("--tmpfs", f"{m['mountPath']}:rw,size=512m,mode=1777")]
    if security.get("readOnlyRootFilesystem"):
        args += ["--read-only", "--read-only-tmpfs=false"]  # no writable folder but the pod's own
    if security.get("capabilities", {}).get("drop") == ["ALL"]:
        args += ["--cap-drop", "ALL"]
    if security.get("allowPrivilegeEscalation") is False:
        args += ["--security-opt", "no-new-privileges"]
    if security.get("procMount") == "Unmasked":
        args += ["--security-opt", "unmask=/proc/*"]
    for item in container.get("env") or []:
        args += ["--env", f"{item['name']}={item['value']}"]
    for key, value in (env or {}).items():
        args += ["--env", f"{key}={value}"]
    if container.get("workingDir"):
        args += ["--workdir", container["workingDir"]]
    return subprocess.run([*args, image, *container["command"]], capture_output=True, text=True, timeout=timeout_s)


def fixed_files(repo: Path, instance: Instance, scratch: Path) -> dict[str, str]:
    """The files the fix changes, fixed: their sha256 by path. Found on the agent's disk, they give the fix away."""
    fixed = scratch / "fixed"
    subprocess.run(["cp", "-r", str(repo), str(fixed)], check=True)
    subprocess.run(["git", "apply", "-"], input=instance.gold_patch, text=True, cwd=fixed, check=True)
    paths = [line[len("+++ b/"):] for line in instance.gold_patch.splitlines() if line.startswith("+++ b/")]
    assert paths
    return {path: hashlib.sha256((fixed / path).read_bytes()).hexdigest() for path in paths}


@pytest.fixture
def workspace(tmp_path: Path) -> Iterator[Path]:
    """The pod's emptyDir: writable by the pod's user whoever runs podman (fsGroup's job on a cluster)."""
    work = tmp_path / "work"
    work.mkdir()
    work.chmod(0o777)
    yield work
    # what the containers' user wrote is not ours to delete where podman runs rootless: empty it from inside
    subprocess.run(["podman", "run", "--rm", "--network", "none", *limits(), "--volume", f"{work}:/work",
                    "--entrypoint", "", f"{SWE_TASKS.image}:{TAG}", "sh", "-c", "rm -rf /work/* /work/.[!.]*"],
                   capture_output=True, timeout=120)


@pytest.mark.parametrize("honest", [True, False], ids=["fix", "edited-tests"])
def test_the_pods_three_steps_in_their_images_grade_a_fix_1_and_edited_tests_0(
        images: dict[str, str], toolz_tasks: Path, bus: BusSettings, tiny_model: Path, tmp_path: Path,
        workspace: Path, honest: bool) -> None:
    task = json.loads((toolz_tasks / "tasks.jsonl").read_text().splitlines()[0])
    instance = load_instances(toolz_tasks / "private" / "instances.jsonl")[task["id"]]
    pod = pod_of(task, tmp_path)["spec"]
    checkout, agent = pod["initContainers"]
    (grade,) = pod["containers"]

    # 1. checkout, from the tasks' image
    done = _podman(images[SWE_TASKS.name], checkout, workspace)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (workspace / "repo" / ".git").is_dir()

    # 2. the agent: mini-swe-agent as the template runs it, against the gateway (a scripted engine behind it).
    # Its first command looks for what it must not see; its second fixes the bug (or edits the failing tests).
    fixed = fixed_files(workspace / "repo", instance, tmp_path)
    if honest:
        change = f"git apply <<'PATCH'\n{instance.gold_patch}PATCH"
    else:
        test_file = instance.fail_to_pass[0].split("::")[0]
        bodies = "".join(f"\n\ndef {t.split('::')[-1]}():\n    assert True\n"
                         for t in instance.fail_to_pass if t.startswith(test_file))
        change = f"cat >> {test_file} <<'TESTS'\n{bodies}\nTESTS"
    replies = (tool_call("bash", {"command": probe({Path(p).name for p in fixed})}),
               tool_call("bash", {"command": change}),
               tool_call("bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}))
    rollout_id = f"swe-pod-{'fix' if honest else 'hack'}-{os.getpid()}"
    with scripted(bus, tiny_model, tmp_path, replies) as gw:
        assert isinstance(gw, RunningGateway)
        token = gw.register(rollout_id)
        env = {"OPENAI_BASE_URL": f"{gw.url}/v1", "OPENAI_API_KEY": token, "TETHER_ROLLOUT_ID": rollout_id}
        ran = _podman(images[SWE_AGENT.name], agent, workspace, network="host", env=env)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    seen = (workspace / "seen").read_text().splitlines()
    found = [line.removeprefix("same name: ").split()[0] for line in seen if line.startswith("same name: ")]
    assert not set(found) & set(fixed.values()), f"the fixed source is on the agent's disk: {seen}"
    assert [line for line in seen if not line.startswith("same name: ")] == [str(USER_ID)], \
        f"the agent's container shows what it must not: {seen}"

    # 3. the grade, from the tasks' image, the working copy read-only: its output is the pod's log
    graded = _podman(images[SWE_TASKS.name], grade, workspace, timeout_s=600)
    assert graded.returncode == 0, graded.stdout[-3000:] + graded.stderr[-3000:]
    verdict = json.loads(graded.stdout.strip().splitlines()[-1])
    assert verdict["hidden"] and verdict["isolated"], verdict  # the jail works inside the container
    assert verdict["refused"] is None, verdict
    log = tmp_path / "rollout.log"  # as the runner copies the pod's log
    log.write_text(graded.stdout)
    reward = load_config(EXAMPLE).reward
    assert reward.command is not None
    read = subprocess.run(reward.command, env={"TETHER_HARNESS_LOG": str(log), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, check=True)
    assert parse_reward(read.stdout) == (1.0 if honest else 0.0), verdict
    if not honest:
        assert any(test_file in path for path in verdict["dropped"]), verdict  # the edited tests were not taken


def test_the_containerfile_builds_the_step_images_from_the_same_base_and_lock() -> None:
    """The tasks' image: Tether's wheel with the `swe` extra; the agent's: the tools alone (no wheel, no tasks)."""
    text = CONTAINERFILE.read_text()

    def stage(header: str) -> str:
        return text.split(f"{header}\n", 1)[1].split("\nFROM ", 1)[0]

    tasks, agent = stage(f"FROM python AS {SWE_TASKS.name}"), stage(f"FROM python AS {SWE_AGENT.name}")
    assert 'install.sh deps "swe"' in stage(f"FROM install AS install-{SWE_TASKS.name}")
    assert "install.sh wheel" in stage(f"FROM install AS install-{SWE_TASKS.name}")
    installed = stage(f"FROM install AS install-{SWE_AGENT.name}")
    assert 'install.sh tools "mini-swe-agent pytest"' in installed and "dist/" not in installed
    assert f"COPY tasks/ {TASKS_DIR}/" in tasks and "tasks" not in agent.replace("no tasks", "")
    assert f"COPY mini.yaml {MINI_CONFIG}" in agent
    for target in (tasks, agent):
        assert f"USER {USER_ID}:{USER_ID}" in target and "HEALTHCHECK NONE" in target and "git" in target
