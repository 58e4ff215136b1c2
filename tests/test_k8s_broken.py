"""infra/k8s: the validation of tests/k8s_support.py has teeth: each deliberately broken manifest (a wrong type,
an unknown field, a broken CEL rule, on Kubernetes and Strimzi kinds alike) is refused, and kubernetes-validate's
own entry point agrees on the Kubernetes ones."""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from tests.k8s_support import OPT, VERSIONS, find, validate


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
