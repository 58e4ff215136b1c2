"""infra/k8s and the load balancer: HAProxy's configuration is infra/loadbalancer.py's with the gateway pods as
servers, and HAProxy itself accepts it (and refuses a broken one)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from infra import loadbalancer
from infra.k8s.options import GATEWAY_LB, GATEWAY_REPLICAS, PORT
from tests.k8s_support import OPT, find, pod_spec


def test_haproxy_is_the_local_load_balancer_with_the_gateway_pods_as_servers() -> None:
    cfg = find("ConfigMap", GATEWAY_LB)["data"]["haproxy.cfg"]
    assert cfg.startswith(loadbalancer.config(port=PORT, replicas=[], host="0.0.0.0").rstrip())
    gateways = find("StatefulSet", GATEWAY_REPLICAS)
    peers = find("Service", gateways["spec"]["serviceName"])
    assert peers["spec"]["clusterIP"] == "None"
    servers = re.findall(r"^\s+server (\S+) (\S+):(\d+) ", cfg, re.MULTILINE)
    assert len(servers) == OPT.gateway_slots >= gateways["spec"]["replicas"] >= 2
    for i, (name, host, port) in enumerate(servers):
        assert name == f"{gateways['metadata']['name']}-{i}"
        assert host == f"{name}.{peers['metadata']['name']}.{OPT.namespace}.svc.{OPT.cluster_domain}"
        assert int(port) == PORT
    lb = find("Deployment", GATEWAY_LB)
    assert lb["spec"]["replicas"] >= 2
    assert pod_spec(lb)["containers"][0]["command"][-1] == "/usr/local/etc/haproxy/haproxy.cfg"


def test_haproxy_accepts_the_configuration_and_refuses_a_broken_one(tmp_path: Path) -> None:
    cfg = find("ConfigMap", GATEWAY_LB)["data"]["haproxy.cfg"]
    path = tmp_path / "haproxy.cfg"
    path.write_text(cfg)
    checked = subprocess.run(["haproxy", "-c", "-f", str(path)], capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    path.write_text(cfg.replace("check resolvers cluster", "check resolvers kube-dns", 1))
    assert subprocess.run(["haproxy", "-c", "-f", str(path)], capture_output=True, timeout=30).returncode != 0
