"""infra/k8s and the controller: its Role is exactly what the Kubernetes runner calls, the example run file loads
and its rollout Jobs are valid, and the NetworkPolicy confines the pods the Job template labels to the gateway."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from controller.config import load_config as load_run
from controller.config import load_tasks
from controller.runners.base import JobSpec
from controller.runners.kubernetes import build_job
from infra.k8s.options import CONFIG, CONTROLLER, GATEWAY_LB, GATEWAY_REPLICAS, JOB_TEMPLATE, PORT, RUN, TRAINER
from tests.k8s_support import OPT, RUNNER, WORKLOADS, find, pod_spec, selects, validate_k8s
from trainer.config import TrainerConfig


def _runner_calls() -> set[tuple[str, str, str]]:
    """(API group, resource, verb) of every Kubernetes API call in controller/runners/kubernetes.py."""
    source = RUNNER.read_text()
    verbs = {"create": "create", "read": "get", "list": "list", "delete": "delete", "patch": "patch",
             "replace": "update"}
    resources = {"job": "jobs", "pod": "pods", "pod_log": "pods/log"}
    groups = {"batch": "batch", "core": ""}
    calls = set()
    for api, verb, resource in re.findall(r"self\.(batch|core)\.(create|read|list|delete|patch|replace)"
                                          r"_namespaced_(\w+)", source):
        calls.add((groups[api], resources[resource], verbs[verb]))
    for api, resource in re.findall(r"Watch\(\)\.stream\(self\.(batch|core)\.list_namespaced_(\w+)", source):
        calls.add((groups[api], resources[resource], "watch"))
    return calls


def test_the_controller_role_is_what_the_kubernetes_runner_calls() -> None:
    calls = _runner_calls()
    assert ("batch", "jobs", "watch") in calls and ("", "pods/log", "get") in calls  # the parse sees them
    role = find("Role", CONTROLLER)
    granted = {(group, resource, verb) for rule in role["rules"] for group in rule["apiGroups"]
               for resource in rule["resources"] for verb in rule["verbs"]}
    assert granted == calls
    binding = find("RoleBinding", CONTROLLER)
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": CONTROLLER, "namespace": OPT.namespace}]
    job = find("Job", f"{CONTROLLER}-{OPT.run_id}")
    assert pod_spec(job)["serviceAccountName"] == find("ServiceAccount", CONTROLLER)["metadata"]["name"]


def test_the_run_file_loads_and_its_jobs_are_valid(tmp_path: Path) -> None:
    files = find("ConfigMap", RUN)["data"]
    assert files["job-template.yaml"] == JOB_TEMPLATE.read_text()
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    run = load_run(tmp_path / "run.yaml")
    assert run.runner == "kubernetes" and run.kubernetes.namespace == OPT.namespace
    assert load_tasks(run.dataset)
    trainer = TrainerConfig.model_validate(yaml.safe_load(find("ConfigMap", TRAINER)["data"]["trainer.yaml"]))
    config = find("ConfigMap", CONFIG)["data"]
    assert run.run_id == trainer.run_id == config["TETHER_GATEWAY_RUN_ID"] == config["TETHER_PROCESSOR_RUN_ID"]
    assert run.harness.job_template is not None
    template = yaml.safe_load(run.harness.job_template.read_text())
    spec = JobSpec(rollout_id=f"{run.run_id}.add-2-3.r0.a0", run_id=run.run_id, task_id="add-2-3", attempt=0,
                   env={"OPENAI_BASE_URL": f"{config['TETHER_CONTROLLER_HARNESS_GATEWAY_URL']}/v1"},
                   log_path=tmp_path / "log", job=template)
    job = build_job(spec, run.kubernetes.namespace, run.timeout_s, run.kubernetes.ttl_s)
    validate_k8s(job)
    # The trainer resumes from its checkpoint volume, mounted where its file says.
    learner = next(c for c in pod_spec(find("StatefulSet", TRAINER))["containers"] if c["name"] == "trainer")
    assert {"name": "checkpoints", "mountPath": str(trainer.checkpoint_dir)} in learner["volumeMounts"]


def test_the_network_policy_lets_rollouts_reach_the_gateway_only() -> None:
    policy = find("NetworkPolicy", "tether-rollouts-reach-only-the-gateway")
    rollout_pod = yaml.safe_load(JOB_TEMPLATE.read_text())["spec"]["template"]["metadata"]["labels"]
    assert selects(policy["spec"]["podSelector"], rollout_pod)
    assert policy["spec"]["ingress"] == []
    to_gateway, to_dns = policy["spec"]["egress"]
    assert to_gateway["ports"] == [{"protocol": "TCP", "port": PORT}]
    reached = []
    for kind, name in [*WORKLOADS, ("Deployment", GATEWAY_LB)]:
        template = find(kind, name)["spec"]["template"]
        if selects(to_gateway["to"][0]["podSelector"], template["metadata"]["labels"]):
            reached.append(name)
            ports = {p["containerPort"] for c in template["spec"]["containers"] for p in c.get("ports", [])}
            assert PORT in ports
    assert sorted(reached) == sorted([GATEWAY_REPLICAS, GATEWAY_LB])
    assert {p["port"] for p in to_dns["ports"]} == {53}
