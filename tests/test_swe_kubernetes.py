"""examples/swe on Kubernetes: the Job template gives each rollout a pod where the agent sees only its working
copy, and the reward comes from a container the agent cannot write to. No cluster here: the pod's three steps
run as local commands, with the pod's two mounts (/tasks, /work) as folders."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.config import load_config
from controller.main import job_template
from controller.placeholders import fill_all
from controller.rewards import parse_reward
from controller.runners.base import JobSpec
from controller.runners.kubernetes import build_job
from swe.build import load_instances
from tests.k8s_support import OPT, resources, selects, validate_k8s

JOB_TEMPLATE = Path(__file__).parent.parent / "infra" / "k8s" / "job-template.yaml"

EXAMPLE = Path(__file__).parent.parent / "examples" / "swe" / "run-kubernetes.yaml"
GATEWAY_ENV = {"OPENAI_BASE_URL": "http://gateway:8000/v1", "OPENAI_API_KEY": "tr1.x.y", "TETHER_ROLLOUT_ID": "r0"}


def pod_of(task: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    config = load_config(EXAMPLE)
    values = {"rollout_id": "swe.t.r0.a1", "run_id": config.run_id, "task_id": task["id"], "attempt": 1}
    spec = JobSpec(rollout_id="swe.t.r0.a1", run_id=config.run_id, task_id=task["id"], attempt=1,
                   env=GATEWAY_ENV, log_path=tmp_path / "log", job=fill_all(job_template(config), values, task))
    pod: dict[str, Any] = build_job(spec, config.kubernetes.namespace, config.timeout_s, ttl_s=600)["spec"]["template"]
    return pod


def mounts(container: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    return {m["mountPath"]: (m["name"], bool(m.get("readOnly"))) for m in container.get("volumeMounts") or []}


def test_the_agent_sees_its_working_copy_and_the_gateway_only(toolz_tasks: Path, tmp_path: Path) -> None:
    task = json.loads((toolz_tasks / "tasks.jsonl").read_text().splitlines()[0])
    pod = pod_of(task, tmp_path)
    spec = pod["spec"]
    checkout, agent = spec["initContainers"]
    (grade,) = spec["containers"]
    assert [checkout["name"], agent["name"], grade["name"]] == ["checkout", "agent", "grade"]
    assert mounts(agent) == {"/work": ("work", False), "/tmp": ("tmp", False)} and "tasks" not in agent["image"]
    assert agent["image"] != checkout["image"] == grade["image"]  # the tasks live in an image the agent never runs
    assert mounts(grade) == {"/work": ("work", True), "/tmp": ("tmp", False)}  # it reads the copy, never writes it
    assert spec["volumes"] == [{"name": "work", "emptyDir": {"sizeLimit": "1Gi"}},
                               {"name": "tmp", "emptyDir": {"sizeLimit": "512Mi"}}]
    assert task["problem"] in agent["command"]  # the problem statement, filled in as one argument
    env = {e["name"]: e["value"] for e in agent["env"]}
    assert env["OPENAI_BASE_URL"] == GATEWAY_ENV["OPENAI_BASE_URL"]  # the runner injects into init containers
    assert spec["automountServiceAccountToken"] is False and spec["restartPolicy"] == "Never"
    assert pod["metadata"]["labels"]["app.kubernetes.io/component"] == "rollout"  # the NetworkPolicy's pods
    assert all(c["securityContext"]["allowPrivilegeEscalation"] is False for c in [checkout, agent, grade])


@pytest.mark.parametrize("template", [EXAMPLE.parent / "job-template.yaml", JOB_TEMPLATE])
def test_a_rollout_s_pod_is_confined_as_the_local_sandbox(template: Path, tmp_path: Path) -> None:
    """Not root, a read-only root filesystem, no capabilities, no privilege to gain, the runtime's seccomp
    profile, no service-account token, no service addresses, writable folders only as sized emptyDirs; and the
    NetworkPolicy selects the pod and lets it reach the gateway and DNS alone. The Job as the runner makes it is
    valid against the API's schemas."""
    job = yaml.safe_load(template.read_text())
    values = {"rollout_id": "r.t.r0.a0", "run_id": "r", "task_id": "t", "attempt": 0}
    task = {"id": "t", "problem": "fix it"}
    spec = JobSpec(rollout_id="r.t.r0.a0", run_id="r", task_id="t", attempt=0, env=GATEWAY_ENV,
                   log_path=tmp_path / "log", job=fill_all(job, values, task))
    built = build_job(spec, OPT.namespace, 600, ttl_s=600)
    validate_k8s(built)
    pod = built["spec"]["template"]
    pod_spec = pod["spec"]
    assert pod_spec["automountServiceAccountToken"] is False and pod_spec["enableServiceLinks"] is False
    assert pod_spec["securityContext"]["runAsNonRoot"] is True and pod_spec["securityContext"]["runAsUser"] > 0
    assert pod_spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert all("emptyDir" in v and v["emptyDir"]["sizeLimit"] for v in pod_spec["volumes"])
    for container in [*pod_spec.get("initContainers", []), *pod_spec["containers"]]:
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] is True and security["capabilities"] == {"drop": ["ALL"]}
        assert security["allowPrivilegeEscalation"] is False and not security.get("privileged")
        assert "/tmp" in mounts(container)
    (policy,) = [d for d in resources() if d["kind"] == "NetworkPolicy"]
    assert selects(policy["spec"]["podSelector"], pod["metadata"]["labels"])
    assert policy["spec"]["ingress"] == [] and set(policy["spec"]["policyTypes"]) == {"Ingress", "Egress"}
    reached = [rule["to"][0]["podSelector"] for rule in policy["spec"]["egress"]]
    assert reached[0]["matchExpressions"][0]["values"] == ["tether-gateway-lb", "tether-gateway"]
    assert reached[1] == {"matchLabels": {"k8s-app": "kube-dns"}} and len(reached) == 2


def test_the_pods_steps_grade_an_honest_fix_1_and_the_controller_reads_it(toolz_tasks: Path,
                                                                        tmp_path: Path) -> None:
    """checkout → agent (here: the gold patch applied) → grade, as the pod runs them; then the run's reward
    command on the grade container's log, as the controller runs it."""
    task = json.loads((toolz_tasks / "tasks.jsonl").read_text().splitlines()[0])
    instance = load_instances(toolz_tasks / "private" / "instances.jsonl")[task["id"]]
    pod = pod_of(task, tmp_path)
    work = tmp_path / "work"
    work.mkdir()

    def local(argv: list[str]) -> list[str]:
        mapped = [a.replace("/tasks", str(toolz_tasks)).replace("/work", str(work)) for a in argv]
        assert mapped[0] == "tether"
        return [sys.executable, "-m", "tether.cli", *mapped[1:]]

    checkout = pod["spec"]["initContainers"][0]
    subprocess.run(local(checkout["command"]), check=True, timeout=120)
    subprocess.run(["git", "apply", "-"], input=instance.gold_patch, text=True, cwd=work / "repo", check=True)
    grade = subprocess.run(local(pod["spec"]["containers"][0]["command"]), capture_output=True, text=True,
                           timeout=600, check=True)
    log = tmp_path / "rollout.log"  # the pod's log, as the runner copies it
    log.write_text(grade.stdout)
    reward = load_config(EXAMPLE).reward
    assert reward.command is not None
    read = subprocess.run(reward.command, env={"TETHER_HARNESS_LOG": str(log), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, check=True)
    assert parse_reward(read.stdout) == 1.0
