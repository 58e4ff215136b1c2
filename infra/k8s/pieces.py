"""The pieces every Tether workload is built of: labels and metadata, the restricted security contexts, Secret
and Kafka-user environment, volumes and mounts, a Tether container, probes, anti-affinity and a
PodDisruptionBudget. Kept apart so that the workloads cannot drift apart in how they run (same settings source,
same security, same labels for selectors to match)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from infra.images.roles import BY_NAME
from infra.k8s.options import CONFIG, MODELS, STATE_DIR, USER_ID, Options
from infra.kafka import acls


def labels(component: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": f"tether-{component}", "app.kubernetes.io/part-of": "tether",
            "app.kubernetes.io/component": component}


def meta(name: str, o: Options, component: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "namespace": o.namespace, "labels": labels(component), **extra}


def pod_security(user: int = USER_ID) -> dict[str, Any]:
    return {"runAsNonRoot": True, "runAsUser": user, "runAsGroup": user, "fsGroup": user,
            "seccompProfile": {"type": "RuntimeDefault"}}


def container_security() -> dict[str, Any]:
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def secret_env(name: str, secret: str, key: str, optional: bool = False) -> dict[str, Any]:
    ref: dict[str, Any] = {"name": secret, "key": key}
    if optional:
        ref["optional"] = True
    return {"name": name, "valueFrom": {"secretKeyRef": ref}}


def bus_env(user: str) -> list[dict[str, Any]]:
    """The service's Kafka user (the ACL table's name; Strimzi's User Operator keeps its password in a Secret of
    the same name)."""
    if user not in acls.BY_NAME:
        raise ValueError(f"{user} is not in the ACL table")
    return [{"name": "TETHER_BUS_USERNAME", "value": user}, secret_env("TETHER_BUS_PASSWORD", user, "password"),
            {"name": "TETHER_BUS_CLIENT_ID", "value": f"tether-{user}"}]


def ca_volume(o: Options) -> dict[str, Any]:
    return {"name": "kafka-ca", "secret": {"secretName": o.ca_secret, "items": [{"key": "ca.crt", "path": "ca.crt"}]}}


def mount(name: str, path: str, read_only: bool = True) -> dict[str, Any]:
    mount: dict[str, Any] = {"name": name, "mountPath": path}
    if read_only:
        mount["readOnly"] = True
    return mount


def models_volume() -> dict[str, Any]:
    return {"name": "models", "persistentVolumeClaim": {"claimName": MODELS, "readOnly": True}}


def tether_container(name: str, o: Options, role: str, env: list[dict[str, Any]], mounts: list[dict[str, Any]],
                     resources: dict[str, Any], command: Sequence[str] | None = None, **extra: Any
                     ) -> dict[str, Any]:
    """A Tether container: its role's image running its role's command (infra/images/roles.py) unless told
    another, settings from tether-config, and a writable folder (the pod's `state` emptyDir) as its working
    directory and HOME (relative `.tether/` paths, library caches), the image's own being read-only to its user."""
    return {"name": name, "image": o.image(role), "command": list(command or BY_NAME[role].command),
            "workingDir": STATE_DIR,
            "envFrom": [{"configMapRef": {"name": CONFIG}}], "env": [{"name": "HOME", "value": STATE_DIR}, *env],
            **extra, "volumeMounts": [mount("state", STATE_DIR, read_only=False), *mounts],
            "resources": resources, "securityContext": container_security()}


STATE_VOLUME = {"name": "state", "emptyDir": {}}


def http_probe(path: str, port: str | int, period: int, failures: int, timeout: int = 1) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": port}, "periodSeconds": period, "failureThreshold": failures,
            "timeoutSeconds": timeout}


def anti_affinity(component: str) -> dict[str, Any]:
    """Replicas on different nodes where the cluster can, so one node's loss takes one replica."""
    return {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
        "weight": 100, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                           "labelSelector": {"matchLabels": labels(component)}}}]}}


def pdb(name: str, o: Options, component: str) -> dict[str, Any]:
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": meta(name, o, component),
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": labels(component)}}}
