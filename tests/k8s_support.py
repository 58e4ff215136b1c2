"""Shared by tests/test_k8s_*.py: the committed manifests (read once), finding a resource in them, and the
validators: the Kubernetes API's schemas through kubernetes-validate (strict: an unknown field is an error) and
Strimzi's CRD schemas made strict as the API server sees them, with their CEL rules checked by hand where the
manifests set the field. One module, so that every test checks the same files the same way."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml
from referencing import Registry, Resource

from infra.k8s import render
from infra.k8s.options import CONTROLLER, DEFAULT, GATEWAY_REPLICAS, PROCESSORS, STRIMZI_API, STRIMZI_SCHEMAS, TRAINER

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "infra" / "k8s"
DOCS = ROOT / "docs" / "deployment.md"
RUNNER = ROOT / "controller" / "runners" / "kubernetes.py"
OPT = DEFAULT
#: The oldest Kubernetes these manifests claim (PodDisruptionBudget policy/v1, seccompProfile, Pod Security
#: labels, CRDs with CEL rules as Strimzi's), and the newest kubernetes-validate knows.
VERSIONS = ("1.30", kubernetes_validate.utils.latest_version())
NOT_RESOURCES = {"kustomization.yaml", "strimzi/kustomization.yaml"}
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
#: The generated files that hold resources (the kustomizations do not).
RESOURCE_FILES = [n for n in render.render() if n not in NOT_RESOURCES]
#: Tether's own workloads (HAProxy's Deployment, tether-gateway-lb, aside).
WORKLOADS = [("StatefulSet", GATEWAY_REPLICAS), ("Deployment", PROCESSORS),
             ("StatefulSet", TRAINER), ("Job", f"{CONTROLLER}-{OPT.run_id}")]


@cache
def committed() -> dict[str, list[dict[str, Any]]]:
    """Every committed manifest file's resources, by path under infra/k8s (read once: copy before changing)."""
    return {name: [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]
            for name in RESOURCE_FILES}


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
    schema: dict[str, Any] = json.loads((STRIMZI_SCHEMAS / f"{kind}.json").read_text())
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
    assert doc["apiVersion"] == STRIMZI_API
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


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a label selector (matchLabels, matchExpressions with In) selects these labels."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    return all(e["operator"] == "In" and labels.get(e["key"]) in e["values"]
               for e in selector.get("matchExpressions", []))

