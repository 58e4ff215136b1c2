"""A run's controller: its ServiceAccount and the Role of exactly what the Kubernetes runner calls
(controller/runners/kubernetes.py), an example run's input (run file, tasks, the harness's Job template) and the
controller Job that runs it. Kept apart: this is per run, and its permissions are checked against the runner."""

from __future__ import annotations

import json
from typing import Any

from infra.k8s.options import CA_DIR, CONTROLLER, GATEWAY_KEYS, JOB_TEMPLATE, RUN, RUN_DIR, STATE_DIR, Doc, Options
from infra.k8s.pieces import (
    STATE_VOLUME,
    bus_env,
    ca_volume,
    labels,
    meta,
    mount,
    pod_security,
    secret_env,
    tether_container,
)
from infra.k8s.yaml_text import dump

#: What the Kubernetes runner (controller/runners/kubernetes.py) calls, and nothing more.
CONTROLLER_RULES: list[dict[str, Any]] = [
    {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create", "get", "list", "watch", "delete"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
]


def controller(o: Options) -> list[Doc]:
    return [
        ("The controller's identity in the cluster (the Kubernetes runner uses the in-cluster config).", {
            "apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(CONTROLLER, o, "controller")}),
        ("Rollout Jobs in this namespace: create, watch, read, delete them; read their pods and logs.", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": meta(CONTROLLER, o, "controller"), "rules": CONTROLLER_RULES}),
        ("", {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
              "metadata": meta(CONTROLLER, o, "controller"),
              "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": CONTROLLER},
              "subjects": [{"kind": "ServiceAccount", "name": CONTROLLER, "namespace": o.namespace}]}),
    ]


EXAMPLE_TASKS = ({"id": "add-2-3", "question": "What is 2 + 3?", "answer": "5"},
                 {"id": "capital-fr", "question": "What is the capital of France?", "answer": "Paris"})


def run_file(o: Options) -> dict[str, Any]:
    return {"run_id": o.run_id, "dataset": "tasks.jsonl", "group_size": 4, "runner": "kubernetes",
            "harness": {"job_template": "job-template.yaml"}, "concurrency": 16, "max_groups_in_flight": 8,
            "timeout_s": 600, "reward": {"source": "harness"},
            "kubernetes": {"namespace": o.namespace, "creations_per_s": 5, "ttl_s": 600},
            "log_dir": f"{STATE_DIR}/runs"}


def controller_run(o: Options) -> list[Doc]:
    files = {"run.yaml": dump(run_file(o)),
             "tasks.jsonl": "".join(json.dumps(task) + "\n" for task in EXAMPLE_TASKS),
             "job-template.yaml": JOB_TEMPLATE.read_text()}
    env = [secret_env("TETHER_CONTROLLER_GATEWAY_SECRET", GATEWAY_KEYS, "secret"),
           secret_env("TETHER_CONTROLLER_GATEWAY_ADMIN_KEY", GATEWAY_KEYS, "admin-key"),
           *bus_env("controller")]
    container = tether_container(
        "controller", o, "controller", env,
        [mount("kafka-ca", CA_DIR), mount("run", RUN_DIR)],
        {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "1Gi"}})
    return [
        ("One run's input: its run file, its tasks and the harness's Job template (a copy of "
         "infra/k8s/job-template.yaml). An example: replace it with `kubectl create configmap` from your own "
         "files (docs/deployment.md).", {
             "apiVersion": "v1", "kind": "ConfigMap", "metadata": meta(RUN, o, "controller"), "data": files}),
        ("The run's controller: it launches a Job per rollout and exits when every task group is done. A crash "
         "restarts it in its pod (restartPolicy OnFailure), and a restarted controller re-attaches to the Jobs "
         "still running (it folds the run's history from tether.rollouts).", {
             "apiVersion": "batch/v1", "kind": "Job", "metadata": meta(f"{CONTROLLER}-{o.run_id}", o, "controller"),
             "spec": {
                 "backoffLimit": 10,
                 "template": {
                     "metadata": {"labels": labels("controller")},
                     "spec": {
                         "serviceAccountName": CONTROLLER,
                         "restartPolicy": "OnFailure",
                         "securityContext": pod_security(),
                         "containers": [container],
                         "volumes": [ca_volume(o), {"name": "run", "configMap": {"name": RUN}}, STATE_VOLUME],
                     }}}}),
    ]
