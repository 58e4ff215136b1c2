"""infra/k8s: how the workloads are shaped: Services select their pods, the processors are at most the partitions
of tether.calls, one trainer and gateways with stable names, the restricted Pod Security Standard for Tether's
pods, and the kustomizations list every resource file."""

from __future__ import annotations

import pytest
import yaml

from infra.k8s import render
from infra.k8s.options import CONTROLLER, GATEWAY_LB, GATEWAY_REPLICAS, PROCESSORS, TRAINER, Options
from infra.k8s.resources import workers
from schemas.topics import CALLS
from tests.k8s_support import K8S, WORKLOADS, committed, find, pod_spec, resources, selects


def test_services_select_their_pods() -> None:
    for service in [d for d in resources() if d["kind"] == "Service"]:
        pods = [d for d in resources() if d["kind"] in ("Deployment", "StatefulSet")
                and selects({"matchLabels": service["spec"]["selector"]}, d["spec"]["template"]["metadata"]["labels"])]
        assert len(pods) == 1, service["metadata"]["name"]
        named = {p["name"] for c in pod_spec(pods[0])["containers"] for p in c.get("ports", [])}
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= named
    for workload in [d for d in resources() if d["kind"] in ("Deployment", "StatefulSet")]:
        assert selects(workload["spec"]["selector"], workload["spec"]["template"]["metadata"]["labels"])
        if workload["kind"] == "StatefulSet":
            assert find("Service", workload["spec"]["serviceName"])


def test_processors_are_at_most_the_partitions_of_calls() -> None:
    processors = find("Deployment", PROCESSORS)
    assert 1 <= processors["spec"]["replicas"] <= CALLS.partitions
    assert processors["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 0
    with pytest.raises(ValueError, match=r"partitions of tether\.calls"):
        workers.processors(Options(processor_replicas=CALLS.partitions + 1))


def test_one_trainer_and_gateways_with_stable_names() -> None:
    assert find("StatefulSet", TRAINER)["spec"]["replicas"] == 1
    gateways = find("StatefulSet", GATEWAY_REPLICAS)
    assert gateways["spec"]["replicas"] >= 2
    (container,) = pod_spec(gateways)["containers"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] == "/health"


def test_tethers_pods_meet_the_restricted_pod_security_standard() -> None:
    for workload in [find(kind, name) for kind, name in WORKLOADS] + [find("Deployment", GATEWAY_LB)]:
        pod = pod_spec(workload)
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in pod["containers"]:
            assert container["securityContext"] == {"allowPrivilegeEscalation": False,
                                                    "capabilities": {"drop": ["ALL"]}}
        assert pod.get("automountServiceAccountToken") is False or pod.get("serviceAccountName") == CONTROLLER


def test_the_kustomizations_list_every_resource_file() -> None:
    base = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert base["resources"] == list(render.BASE)
    strimzi = yaml.safe_load((K8S / "strimzi" / "kustomization.yaml").read_text())
    assert strimzi["resources"] == ["topics.yaml", "users.yaml"]
    listed = {*base["resources"], *(f"strimzi/{r}" for r in strimzi["resources"])}
    per_run_or_optional = {"run/input.yaml", "run/controller.yaml", "strimzi/kafka.yaml"}
    assert listed | per_run_or_optional == set(committed())
    images = {c["image"] for kind, name in WORKLOADS for c in pod_spec(find(kind, name))["containers"]}
    assert images == {f"{i['name']}:{i['newTag']}" for i in base["images"]}


def test_each_container_runs_its_roles_image_and_command_from_the_images_table() -> None:
    """The manifests and the images (infra/images) read one table: a port, a path or a command changed there
    changes both."""
    from infra.images.roles import BY_NAME, STATE_DIR, USER_ID
    from infra.k8s.options import DEFAULT as options

    run = yaml.safe_load_all((K8S / "run" / "controller.yaml").read_text())
    pods = [pod_spec(find(kind, name)) for kind, name in WORKLOADS] + [
        d["spec"]["template"]["spec"] for d in run if d and d.get("kind") == "Job"]
    seen = set()
    for pod in pods:
        for c in pod["containers"]:
            role = "trainer" if c["name"] == "engine" else c["name"]
            assert c["image"] == options.image(role)
            assert c["command"] == (["tether", "engine", "serve"] if c["name"] == "engine" else
                                    list(BY_NAME[role].command))
            assert pod["securityContext"]["runAsUser"] == USER_ID and c["workingDir"] == STATE_DIR
            seen.add(role)
    assert seen == {"gateway", "processors", "controller", "trainer"}
