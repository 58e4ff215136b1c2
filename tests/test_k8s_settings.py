"""infra/k8s and the services' settings: every TETHER_* variable the manifests set is a setting some service reads,
each service's settings accept the environment its pod gets, and every Secret, ConfigMap and claim a pod
refers to is shipped here, made by Strimzi or created as docs/deployment.md says."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic_settings import BaseSettings

from controller.settings import ControllerSettings
from engine.settings import EngineSettings
from gateway.settings import GatewaySettings
from infra.k8s.options import CONFIG, ENGINE, ENGINE_PORT, GATEWAY, GATEWAY_LB, GATEWAY_REPLICAS, PORT
from infra.kafka import acls
from schemas.settings import BusSettings
from stream_processors.settings import ProcessorSettings
from tests.k8s_support import DOCS, OPT, WORKLOADS, find, pod_spec, resources

SETTINGS: dict[str, type[BaseSettings]] = {
    "TETHER_BUS_": BusSettings, "TETHER_GATEWAY_": GatewaySettings, "TETHER_CONTROLLER_": ControllerSettings,
    "TETHER_PROCESSOR_": ProcessorSettings, "TETHER_ENGINE_": EngineSettings,
}


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
    names = set(find("ConfigMap", CONFIG)["data"])
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
            assert settings.gateway_id == f"{GATEWAY_REPLICAS}-0"
            assert settings.url == f"http://{OPT.pod_dns(0)}:{PORT}"
            assert settings.engines == [OPT.service_url(ENGINE, ENGINE_PORT)]
            assert str(settings.tokenizer).startswith(mounts["models"])
        if isinstance(settings, ProcessorSettings):
            assert settings.app_id.startswith(acls.PROCESSOR_PREFIX)  # its own topics and group, by the ACLs
            assert not settings.clickhouse_dsn
            assert str(settings.data_dir).startswith(mounts["state"])
        if isinstance(settings, ControllerSettings):
            assert settings.gateway_url == settings.harness_url == OPT.service_url(GATEWAY, PORT)
    assert seen == set(expected)


def test_secrets_and_config_maps_are_shipped_made_by_strimzi_or_documented() -> None:
    docs = DOCS.read_text()
    documented: dict[str, set[str]] = {}
    for match in re.finditer(r"create secret generic (\S+)((?:[^\n]*\\\n)*[^\n]*)", docs):
        documented[match.group(1)] = set(re.findall(r"--from-literal=([\w.-]+)=", match.group(2)))
    strimzi = {user: {"password"} for user in acls.BY_NAME} | {OPT.ca_secret: {"ca.crt"}}
    config_maps = {d["metadata"]["name"]: set(d["data"]) for d in resources() if d["kind"] == "ConfigMap"}
    claims = {d["metadata"]["name"] for d in resources() if d["kind"] == "PersistentVolumeClaim"}
    for workload in [find(kind, name) for kind, name in WORKLOADS] + [find("Deployment", GATEWAY_LB)]:
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
