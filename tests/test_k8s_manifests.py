"""infra/k8s: the committed manifests are a fresh render of the project's tables, valid against the Kubernetes API's
schemas (kubernetes-validate, offline, strict: an unknown field is an error) and Strimzi's CRD schemas (generated
by Strimzi's own CRD generator, infra/k8s/strimzi/schemas/), and consistent with the code they deploy: every
TETHER_* variable is a setting and every service accepts its environment, the Role is what the Kubernetes runner
calls, the NetworkPolicy selects what the Job template labels, HAProxy's servers are the gateway pods. A broken
manifest fails (test_a_broken_manifest_is_refused)."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from pydantic_settings import BaseSettings
from referencing import Registry, Resource
from typer.testing import CliRunner

from controller.config import load_config as load_run
from controller.config import load_tasks
from controller.runners.base import JobSpec
from controller.runners.kubernetes import build_job
from controller.settings import ControllerSettings
from gateway.settings import GatewaySettings
from infra import loadbalancer
from infra.k8s import render
from infra.kafka import acls
from schemas.settings import BusSettings, min_insync_replicas
from schemas.topics import CALLS, CATALOGUE
from stream_processors.settings import ProcessorSettings
from tether.cli_k8s import k8s_app
from trainer.config import TrainerConfig
from trainer.engine.settings import EngineSettings

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "infra" / "k8s"
DOCS = ROOT / "docs" / "deployment.md"
RUNNER = ROOT / "controller" / "runners" / "kubernetes.py"
OPT = render.DEFAULT
#: The oldest Kubernetes these manifests claim (PodDisruptionBudget policy/v1, seccompProfile, Pod Security
#: labels, CRDs with CEL rules as Strimzi's), and the newest kubernetes-validate knows.
VERSIONS = ("1.30", kubernetes_validate.utils.latest_version())
NOT_RESOURCES = {"kustomization.yaml", "strimzi/kustomization.yaml"}
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


@cache
def committed() -> dict[str, list[dict[str, Any]]]:
    """Every committed manifest file's resources, by path under infra/k8s (read once: copy before changing)."""
    return {name: [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]
            for name in render.render() if name not in NOT_RESOURCES}


@cache
def resources() -> list[dict[str, Any]]:
    return [doc for docs in committed().values() for doc in docs]


def find(kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in resources() if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


# -- validators --------------------------------------------------------------------------------------------------

_contents = cache(kubernetes_validate.utils.schema_contents)


@cache
def k8s_validator(version: str, api_version: str, kind: str) -> jsonschema.Draft202012Validator:
    """kubernetes_validate.validate(doc, version, strict=True)'s validator, built once per kind (it reads and
    parses the whole definitions file on every call)."""
    utils = kubernetes_validate.utils
    found = [v for v in utils.all_versions() if utils.major_minor(v) <= utils.major_minor(version)][-1]
    folder = f"kubernetes-json-schema/v{found}-local-strict"
    group = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    schema = _contents(f"{folder}/{kind.lower()}-{group}.json", version)
    registry = Resource.from_contents(_contents(f"{folder}/_definitions.json", version)) @ (
        Resource.from_contents(schema) @ Registry())
    return jsonschema.Draft202012Validator(schema, registry=registry)


def validate_k8s(doc: dict[str, Any]) -> None:
    for version in VERSIONS:
        k8s_validator(version, doc["apiVersion"], doc["kind"]).validate(doc)


def _strict(schema: Any) -> Any:
    """The API server's view of a structural schema: fields it does not declare are unknown (kubectl's strict
    field validation refuses them; the server would drop them), unless it preserves unknown fields."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: ({n: _strict(s) for n, s in v.items()} if k == "properties" else _strict(v)) for k, v in schema.items()}
    if "properties" in schema and "additionalProperties" not in schema \
            and not schema.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


@cache
def strimzi_schema(kind: str) -> dict[str, Any]:
    schema: dict[str, Any] = json.loads((render.STRIMZI_SCHEMAS / f"{kind}.json").read_text())
    return schema


@cache
def strimzi_validator(kind: str) -> jsonschema.Draft7Validator:
    return jsonschema.Draft7Validator(_strict(strimzi_schema(kind)))


def cel_rules(schema: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """(path, rule) of every x-kubernetes-validations rule (CEL), which no offline validator evaluates."""
    if not isinstance(schema, dict):
        return
    for rule in schema.get("x-kubernetes-validations", []):
        yield path, rule["rule"]
    for name, sub in (schema.get("properties") or {}).items():
        yield from cel_rules(sub, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        yield from cel_rules(schema.get(key), f"{path}[]")
    for key in ("oneOf", "anyOf", "allOf"):
        for sub in schema.get(key, []):
            yield from cel_rules(sub, path)


def _at(doc: Any, path: str) -> Any:
    for part in path.strip(".").split("."):
        if not isinstance(doc, dict) or part not in doc:
            return None
        doc = doc[part]
    return doc


def _scram_has_no_certificate_validity(authentication: dict[str, Any]) -> bool:
    """KafkaUser's spec.authentication rules: validityDays and renewalDays only with type tls."""
    return authentication["type"] != "tls" and not {"validityDays", "renewalDays"} & set(authentication)


#: The CEL rules on a path these manifests set, checked here by hand.
CEL_CHECKS: dict[tuple[str, str], Callable[[Any], bool]] = {
    ("KafkaUser", ".spec.authentication"): _scram_has_no_certificate_validity,
}


def validate_strimzi(doc: dict[str, Any]) -> None:
    assert doc["apiVersion"] == render.STRIMZI_API
    strimzi_validator(doc["kind"]).validate(doc)
    # metadata is ObjectMeta, which the CRD leaves to the API server: validate it as the server does.
    validate_k8s({"apiVersion": "v1", "kind": "ConfigMap", "metadata": doc["metadata"]})
    if doc["kind"] != "Kafka":  # the others name their cluster
        assert doc["metadata"]["labels"]["strimzi.io/cluster"] == OPT.kafka_cluster
    for path, rule in cel_rules(strimzi_schema(doc["kind"])):
        value = _at(doc, path)
        if value is not None:
            check = CEL_CHECKS.get((doc["kind"], path))
            assert check is not None, f"{doc['kind']} sets {path}, which has a CEL rule to check here: {rule}"
            assert check(value), f"{doc['kind']} {path} breaks {rule}"


def validate(doc: dict[str, Any]) -> None:
    if doc["apiVersion"].startswith("kafka.strimzi.io/"):
        validate_strimzi(doc)
    else:
        validate_k8s(doc)


# -- one source of truth -----------------------------------------------------------------------------------------

def test_the_committed_manifests_are_a_fresh_render() -> None:
    assert render.stale(K8S) == [], "run `python -m infra.k8s.render` (or `tether k8s render`) and commit"
    generated = set(render.render())
    by_hand = {"job-template.yaml", "strimzi/pom.xml"}
    on_disk = {str(p.relative_to(K8S)) for p in K8S.rglob("*") if p.is_file() and p.suffix in (".yaml", ".xml")}
    assert on_disk == generated | by_hand, "a manifest nothing renders"


def test_a_drifted_file_is_named_and_the_check_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    render.write(tmp_path)
    assert render.main(["--out", str(tmp_path), "--check"]) == 0
    users = tmp_path / "strimzi" / "users.yaml"
    users.write_text(users.read_text().replace("- Describe", "- DescribeConfigs", 1))
    assert render.stale(tmp_path) == ["strimzi/users.yaml"]
    assert render.main(["--out", str(tmp_path), "--check"]) == 1
    assert "users.yaml: differs from a fresh render" in capsys.readouterr().err


def test_topics_are_the_catalogue() -> None:
    topics = {d["metadata"]["name"]: d["spec"] for d in committed()["strimzi/topics.yaml"]}
    assert list(topics) == [t.name for t in CATALOGUE]
    for topic in CATALOGUE:
        spec = topics[topic.name]
        assert spec["partitions"] == topic.partitions
        assert spec["replicas"] == OPT.replication_factor == 3
        config = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in spec["config"].items()}
        assert config == {**topic.config, "min.insync.replicas": str(min_insync_replicas(3))} \
            and config["min.insync.replicas"] == "2"


def test_users_are_the_acl_table() -> None:
    users = {d["metadata"]["name"]: d["spec"] for d in committed()["strimzi/users.yaml"]}
    assert set(users) == set(acls.BY_NAME) and acls.ADMIN not in users
    for name, spec in users.items():
        assert spec["authentication"] == {"type": "scram-sha-512"}
        assert spec["authorization"]["type"] == "simple"
        granted = {(a["resource"]["type"], a["resource"]["name"], a["resource"]["patternType"],
                    tuple(a["operations"])) for a in spec["authorization"]["acls"]}
        assert all(a["type"] == "allow" for a in spec["authorization"]["acls"])
        assert granted == {(a.resource, a.name, a.pattern, a.operations) for a in acls.BY_NAME[name].acls}
    gateway = {a["resource"]["name"]: a["operations"] for a in users["gateway"]["authorization"]["acls"]}
    assert "tether.samples" not in gateway  # the table's own example: the gateway cannot write samples


# -- schemas -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", [n for n in render.render() if n not in NOT_RESOURCES])
def test_manifests_validate_against_the_schemas(name: str) -> None:
    docs = committed()[name]
    assert docs
    for doc in docs:
        validate(doc)
        meta = doc["metadata"]
        assert DNS_SUBDOMAIN.match(meta["name"]) and len(meta["name"]) <= 253, meta["name"]
        if doc["kind"] == "Namespace":
            assert meta["name"] == OPT.namespace
        else:
            assert meta["namespace"] == OPT.namespace
        if doc["kind"] in ("Service", "StatefulSet"):  # Service names and pod host names are DNS labels
            assert DNS_LABEL.match(meta["name"]) and len(meta["name"]) <= 63 - 3, meta["name"]


def test_every_strimzi_kind_rendered_has_its_schema() -> None:
    kinds = {d["kind"] for d in resources() if d["apiVersion"].startswith("kafka.strimzi.io/")}
    assert kinds == set(render.STRIMZI_KINDS)
    for kind in kinds:
        assert strimzi_schema(kind)["$comment"].startswith(f"{render.STRIMZI_API} {kind}: ")


def _set(doc: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for part in parents:
        doc = doc[int(part)] if part.isdigit() else doc[part]  # type: ignore[index]
    doc[int(last) if last.isdigit() else last] = value  # type: ignore[index]


BROKEN = [
    ("an unknown container field", "Deployment", "tether-processors",
     "spec.template.spec.containers.0.imagePullPolice", "Always"),
    ("replicas as a word", "StatefulSet", "tether-gateway-replica", "spec.replicas", "two"),
    ("a probe's port as a list", "StatefulSet", "tether-gateway-replica",
     "spec.template.spec.containers.0.readinessProbe.httpGet.port", [8000]),
    ("a Role verb list as a string", "Role", "tether-controller", "rules.0.verbs", "create"),
    ("no partitions", "KafkaTopic", "tether.calls", "spec.partitions", 0),
    ("a misspelt ACL operation", "KafkaUser", "gateway", "spec.authorization.acls.0.operations", ["Wrtie"]),
    ("an unknown KafkaUser field", "KafkaUser", "trainer", "spec.authorisation", {"type": "simple"}),
    ("SCRAM with certificate validity", "KafkaUser", "controller", "spec.authentication.validityDays", 30),
    ("a listener without tls", "Kafka", OPT.kafka_cluster, "spec.kafka.listeners.0.tls", "yes"),
    ("a label that is not a string on a KafkaTopic", "KafkaTopic", "tether.samples", "metadata.labels.x", 5),
    ("a node pool without storage type", "KafkaNodePool", f"{OPT.kafka_cluster}-nodes", "spec.storage", {}),
]


@pytest.mark.parametrize(("why", "kind", "name", "path", "value"), BROKEN, ids=[b[0] for b in BROKEN])
def test_a_broken_manifest_is_refused(why: str, kind: str, name: str, path: str, value: Any) -> None:
    doc = copy.deepcopy(find(kind, name))
    validate(doc)
    _set(doc, path, value)
    with pytest.raises((jsonschema.ValidationError, AssertionError)):
        validate(doc)
    if not doc["apiVersion"].startswith("kafka.strimzi.io/"):  # and kubernetes-validate's own entry point agrees
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(doc, VERSIONS[-1], strict=True)


# -- consistency with the code -----------------------------------------------------------------------------------

SETTINGS: dict[str, type[BaseSettings]] = {
    "TETHER_BUS_": BusSettings, "TETHER_GATEWAY_": GatewaySettings, "TETHER_CONTROLLER_": ControllerSettings,
    "TETHER_PROCESSOR_": ProcessorSettings, "TETHER_ENGINE_": EngineSettings,
}
WORKLOADS = [("StatefulSet", render.GATEWAY_REPLICAS), ("Deployment", render.PROCESSORS),
             ("StatefulSet", render.TRAINER), ("Job", f"{render.CONTROLLER}-{OPT.run_id}")]


def containers() -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for kind, name in WORKLOADS:
        workload = find(kind, name)
        for container in pod_spec(workload)["containers"]:
            yield workload, container


def environment(workload: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
    """The container's environment as the kubelet makes it; secrets as stand-ins, the pod name as its first."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env |= find("ConfigMap", source["configMapRef"]["name"])["data"]
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], var["value"])
        elif "secretKeyRef" in var["valueFrom"]:
            ref = var["valueFrom"]["secretKeyRef"]
            if not ref.get("optional"):
                env[var["name"]] = f"from-secret-{ref['name']}-{ref['key']}"
        else:
            assert var["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
            env[var["name"]] = f"{workload['metadata']['name']}-0"
    return env


def test_every_tether_variable_is_a_setting() -> None:
    names = set(find("ConfigMap", render.CONFIG)["data"])
    names |= {v["name"] for _, c in containers() for v in c.get("env", [])}
    assert {name for name in names if not name.startswith("TETHER_")} == {"HOME"}
    for name in names - {"HOME"}:
        prefix = next((p for p in SETTINGS if name.startswith(p)), None)
        assert prefix is not None, f"{name}: no service reads it"
        assert name[len(prefix):].lower() in SETTINGS[prefix].model_fields, f"{name}: not a setting"


def test_each_service_accepts_its_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_text("stand-in")
    expected = {"gateway": GatewaySettings, "processors": ProcessorSettings, "controller": ControllerSettings,
                "trainer": BusSettings, "engine": EngineSettings}
    seen = set()
    for workload, container in containers():
        env = environment(workload, container)
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        if "TETHER_BUS_USERNAME" in env or container["name"] != "engine":
            # The CA file the settings name is the Strimzi cluster CA, mounted where they say.
            volumes = {v["name"]: v for v in pod_spec(workload)["volumes"]}
            assert env["TETHER_BUS_CA_FILE"] == f"{mounts['kafka-ca']}/ca.crt"
            assert volumes["kafka-ca"]["secret"] == {"secretName": OPT.ca_secret,
                                                     "items": [{"key": "ca.crt", "path": "ca.crt"}]}
            env["TETHER_BUS_CA_FILE"] = str(ca)
        for name in [n for n in os.environ if n.startswith("TETHER_")]:
            monkeypatch.delenv(name)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        settings = expected[container["name"]]()
        seen.add(container["name"])
        bus = getattr(settings, "bus", settings)
        if isinstance(bus, BusSettings) and container["name"] != "engine":
            assert bus.security_protocol == "SASL_SSL" and bus.sasl_mechanism == "SCRAM-SHA-512"
            assert bus.username == container["name"] and bus.username in acls.BY_NAME
            assert bus.bootstrap_servers == OPT.bootstrap and bus.replication_factor == 3
        if isinstance(settings, GatewaySettings):
            settings.check_exposure()  # listens on 0.0.0.0 with keys from the Secret, not the built-in ones
            assert settings.gateway_id == f"{render.GATEWAY_REPLICAS}-0"
            assert settings.url == f"http://{OPT.pod_dns(0)}:{render.PORT}"
            assert settings.engines == [OPT.service_url(render.ENGINE, render.ENGINE_PORT)]
            assert str(settings.tokenizer).startswith(mounts["models"])
        if isinstance(settings, ProcessorSettings):
            assert settings.app_id.startswith(acls.PROCESSOR_PREFIX)  # its own topics and group, by the ACLs
            assert not settings.clickhouse_dsn
            assert str(settings.data_dir).startswith(mounts["state"])
        if isinstance(settings, ControllerSettings):
            assert settings.gateway_url == settings.harness_url == OPT.service_url(render.GATEWAY, render.PORT)
    assert seen == set(expected)


def test_secrets_and_config_maps_are_shipped_made_by_strimzi_or_documented() -> None:
    docs = DOCS.read_text()
    documented: dict[str, set[str]] = {}
    for match in re.finditer(r"create secret generic (\S+)((?:[^\n]*\\\n)*[^\n]*)", docs):
        documented[match.group(1)] = set(re.findall(r"--from-literal=([\w.-]+)=", match.group(2)))
    strimzi = {user: {"password"} for user in acls.BY_NAME} | {OPT.ca_secret: {"ca.crt"}}
    config_maps = {d["metadata"]["name"]: set(d["data"]) for d in resources() if d["kind"] == "ConfigMap"}
    claims = {d["metadata"]["name"] for d in resources() if d["kind"] == "PersistentVolumeClaim"}
    for workload in [find(kind, name) for kind, name in WORKLOADS] + [find("Deployment", render.GATEWAY_LB)]:
        pod = pod_spec(workload)
        templates = {t["metadata"]["name"] for t in workload["spec"].get("volumeClaimTemplates", [])}
        for volume in pod["volumes"]:
            if "secret" in volume:
                keys = {i["key"] for i in volume["secret"]["items"]}
                assert keys <= strimzi.get(volume["secret"]["secretName"], set()), volume
            elif "configMap" in volume:
                assert volume["configMap"]["name"] in config_maps, volume
            elif "persistentVolumeClaim" in volume:
                assert volume["persistentVolumeClaim"]["claimName"] in claims, volume
        for container in pod["containers"]:
            mounted = {m["name"] for m in container["volumeMounts"]}
            assert mounted <= {v["name"] for v in pod["volumes"]} | templates, container["name"]
            for var in container.get("env", []):
                ref = var.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    known = strimzi.get(ref["name"], set()) | documented.get(ref["name"], set())
                    assert ref["key"] in known, f"{ref} is neither made by Strimzi nor in docs/deployment.md"


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
    role = find("Role", render.CONTROLLER)
    granted = {(group, resource, verb) for rule in role["rules"] for group in rule["apiGroups"]
               for resource in rule["resources"] for verb in rule["verbs"]}
    assert granted == calls
    binding = find("RoleBinding", render.CONTROLLER)
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": render.CONTROLLER, "namespace": OPT.namespace}]
    job = find("Job", f"{render.CONTROLLER}-{OPT.run_id}")
    assert pod_spec(job)["serviceAccountName"] == find("ServiceAccount", render.CONTROLLER)["metadata"]["name"]


def test_the_run_file_loads_and_its_jobs_are_valid(tmp_path: Path) -> None:
    files = find("ConfigMap", render.RUN)["data"]
    assert files["job-template.yaml"] == render.JOB_TEMPLATE.read_text()
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    run = load_run(tmp_path / "run.yaml")
    assert run.runner == "kubernetes" and run.kubernetes.namespace == OPT.namespace
    assert load_tasks(run.dataset)
    trainer = TrainerConfig.model_validate(yaml.safe_load(find("ConfigMap", render.TRAINER)["data"]["trainer.yaml"]))
    config = find("ConfigMap", render.CONFIG)["data"]
    assert run.run_id == trainer.run_id == config["TETHER_GATEWAY_RUN_ID"] == config["TETHER_PROCESSOR_RUN_ID"]
    assert run.harness.job_template is not None
    template = yaml.safe_load(run.harness.job_template.read_text())
    spec = JobSpec(rollout_id=f"{run.run_id}.add-2-3.r0.a0", run_id=run.run_id, task_id="add-2-3", attempt=0,
                   env={"OPENAI_BASE_URL": f"{config['TETHER_CONTROLLER_HARNESS_GATEWAY_URL']}/v1"},
                   log_path=tmp_path / "log", job=template)
    job = build_job(spec, run.kubernetes.namespace, run.timeout_s, run.kubernetes.ttl_s)
    validate_k8s(job)
    # The trainer resumes from its checkpoint volume, mounted where its file says.
    learner = next(c for c in pod_spec(find("StatefulSet", render.TRAINER))["containers"] if c["name"] == "trainer")
    assert {"name": "checkpoints", "mountPath": str(trainer.checkpoint_dir)} in learner["volumeMounts"]


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    return all(e["operator"] == "In" and labels.get(e["key"]) in e["values"]
               for e in selector.get("matchExpressions", []))


def test_the_network_policy_lets_rollouts_reach_the_gateway_only() -> None:
    policy = find("NetworkPolicy", "tether-rollouts-reach-only-the-gateway")
    rollout_pod = yaml.safe_load(render.JOB_TEMPLATE.read_text())["spec"]["template"]["metadata"]["labels"]
    assert _selects(policy["spec"]["podSelector"], rollout_pod)
    assert policy["spec"]["ingress"] == []
    to_gateway, to_dns = policy["spec"]["egress"]
    assert to_gateway["ports"] == [{"protocol": "TCP", "port": render.PORT}]
    reached = []
    for kind, name in [*WORKLOADS, ("Deployment", render.GATEWAY_LB)]:
        template = find(kind, name)["spec"]["template"]
        if _selects(to_gateway["to"][0]["podSelector"], template["metadata"]["labels"]):
            reached.append(name)
            ports = {p["containerPort"] for c in template["spec"]["containers"] for p in c.get("ports", [])}
            assert render.PORT in ports
    assert sorted(reached) == sorted([render.GATEWAY_REPLICAS, render.GATEWAY_LB])
    assert {p["port"] for p in to_dns["ports"]} == {53}


def test_services_select_their_pods() -> None:
    for service in [d for d in resources() if d["kind"] == "Service"]:
        pods = [d for d in resources() if d["kind"] in ("Deployment", "StatefulSet")
                and _selects({"matchLabels": service["spec"]["selector"]}, d["spec"]["template"]["metadata"]["labels"])]
        assert len(pods) == 1, service["metadata"]["name"]
        named = {p["name"] for c in pod_spec(pods[0])["containers"] for p in c.get("ports", [])}
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= named
    for workload in [d for d in resources() if d["kind"] in ("Deployment", "StatefulSet")]:
        assert _selects(workload["spec"]["selector"], workload["spec"]["template"]["metadata"]["labels"])
        if workload["kind"] == "StatefulSet":
            assert find("Service", workload["spec"]["serviceName"])


def test_haproxy_is_the_local_load_balancer_with_the_gateway_pods_as_servers() -> None:
    cfg = find("ConfigMap", render.GATEWAY_LB)["data"]["haproxy.cfg"]
    assert cfg.startswith(loadbalancer.config(port=render.PORT, replicas=[], host="0.0.0.0").rstrip())
    gateways = find("StatefulSet", render.GATEWAY_REPLICAS)
    peers = find("Service", gateways["spec"]["serviceName"])
    assert peers["spec"]["clusterIP"] == "None"
    servers = re.findall(r"^\s+server (\S+) (\S+):(\d+) ", cfg, re.MULTILINE)
    assert len(servers) == OPT.gateway_slots >= gateways["spec"]["replicas"] >= 2
    for i, (name, host, port) in enumerate(servers):
        assert name == f"{gateways['metadata']['name']}-{i}"
        assert host == f"{name}.{peers['metadata']['name']}.{OPT.namespace}.svc.{OPT.cluster_domain}"
        assert int(port) == render.PORT
    lb = find("Deployment", render.GATEWAY_LB)
    assert lb["spec"]["replicas"] >= 2
    assert pod_spec(lb)["containers"][0]["command"][-1] == "/usr/local/etc/haproxy/haproxy.cfg"


def test_haproxy_accepts_the_configuration_and_refuses_a_broken_one(tmp_path: Path) -> None:
    cfg = find("ConfigMap", render.GATEWAY_LB)["data"]["haproxy.cfg"]
    path = tmp_path / "haproxy.cfg"
    path.write_text(cfg)
    checked = subprocess.run(["haproxy", "-c", "-f", str(path)], capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    path.write_text(cfg.replace("check resolvers cluster", "check resolvers kube-dns", 1))
    assert subprocess.run(["haproxy", "-c", "-f", str(path)], capture_output=True, timeout=30).returncode != 0


def test_processors_are_at_most_the_partitions_of_calls() -> None:
    processors = find("Deployment", render.PROCESSORS)
    assert 1 <= processors["spec"]["replicas"] <= CALLS.partitions
    assert processors["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 0
    with pytest.raises(ValueError, match=r"partitions of tether\.calls"):
        render.processors(render.Options(processor_replicas=CALLS.partitions + 1))


def test_one_trainer_and_gateways_with_stable_names() -> None:
    assert find("StatefulSet", render.TRAINER)["spec"]["replicas"] == 1
    gateways = find("StatefulSet", render.GATEWAY_REPLICAS)
    assert gateways["spec"]["replicas"] >= 2
    (container,) = pod_spec(gateways)["containers"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] == "/health"


def test_tethers_pods_meet_the_restricted_pod_security_standard() -> None:
    for workload in [find(kind, name) for kind, name in WORKLOADS] + [find("Deployment", render.GATEWAY_LB)]:
        pod = pod_spec(workload)
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in pod["containers"]:
            assert container["securityContext"] == {"allowPrivilegeEscalation": False,
                                                    "capabilities": {"drop": ["ALL"]}}
        assert pod.get("automountServiceAccountToken") is False or pod.get("serviceAccountName") == render.CONTROLLER


def test_the_kustomizations_list_every_resource_file() -> None:
    base = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert base["resources"] == list(render.BASE)
    strimzi = yaml.safe_load((K8S / "strimzi" / "kustomization.yaml").read_text())
    assert strimzi["resources"] == ["topics.yaml", "users.yaml"]
    listed = {*base["resources"], *(f"strimzi/{r}" for r in strimzi["resources"])}
    per_run_or_optional = {"run/input.yaml", "run/controller.yaml", "strimzi/kafka.yaml"}
    assert listed | per_run_or_optional == set(committed())
    images = {c["image"] for kind, name in WORKLOADS for c in pod_spec(find(kind, name))["containers"]}
    assert images == {f"{base['images'][0]['name']}:{base['images'][0]['newTag']}"}


def test_the_command_renders_checks_and_takes_options(tmp_path: Path) -> None:
    """`tether k8s render` (tether/cli_k8s.py): the same files; --check fails on a drifted one; a namespace moves
    everything, HAProxy's server names included."""
    runner = CliRunner()
    same = tmp_path / "same"
    assert runner.invoke(k8s_app, ["render", "--out", str(same)]).exit_code == 0
    assert render.stale(same) == [] and runner.invoke(k8s_app, ["render", "--out", str(same), "--check"]).exit_code == 0
    (same / "gateway.yaml").write_text("# edited\n")
    checked = runner.invoke(k8s_app, ["render", "--out", str(same), "--check"])
    assert checked.exit_code == 1 and "gateway.yaml" in checked.output
    other = tmp_path / "other"
    assert runner.invoke(k8s_app, ["render", "--out", str(other), "--namespace", "agents", "--run-id", "r7",
                                   "--gateway-replicas", "3"]).exit_code == 0
    text = {p.name: p.read_text() for p in other.rglob("*.yaml")}
    assert "namespace: tether" not in "".join(text.values())
    assert "tether-gateway-replica-0.tether-gateway-replicas.agents.svc.cluster.local:8000" in text["gateway-lb.yaml"]
    assert "run_id: r7" in (other / "run" / "input.yaml").read_text()
    refused = runner.invoke(k8s_app, ["render", "--out", str(other), "--processor-replicas", "9"])
    assert refused.exit_code == 2 and "partitions of tether.calls" in refused.output
    refused = runner.invoke(k8s_app, ["render", "--out", str(other), "--gateway-replicas", "9"])
    assert refused.exit_code == 2 and "gateway slots must be at least the gateway replicas" in refused.output
    assert render.main(["--out", str(other), "--gateway-replicas", "9"]) == 2
