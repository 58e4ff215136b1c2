"""The gateways and HAProxy in front of them: a StatefulSet of gateways (stable names: gateway ids on
tether.control and HAProxy servers) with its headless Service, and HAProxy as a Deployment whose configuration is
infra/loadbalancer.py's, its servers the gateway pods by DNS name. Kept together: the HAProxy servers are exactly
the StatefulSet's pods, and one module says both."""

from __future__ import annotations

import hashlib
from typing import Any

from infra import loadbalancer
from infra.k8s.options import (
    CA_DIR,
    GATEWAY,
    GATEWAY_KEYS,
    GATEWAY_LB,
    GATEWAY_PEERS,
    GATEWAY_REPLICAS,
    HAPROXY_USER_ID,
    LB_HEALTH_PORT,
    MODELS_DIR,
    PORT,
    Doc,
    Options,
)
from infra.k8s.pieces import (
    STATE_VOLUME,
    anti_affinity,
    bus_env,
    ca_volume,
    container_security,
    http_probe,
    labels,
    meta,
    models_volume,
    mount,
    pdb,
    pod_security,
    secret_env,
    tether_container,
)


def gateway(o: Options) -> list[Doc]:
    env: list[dict[str, Any]] = [
        {"name": "TETHER_GATEWAY_GATEWAY_ID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "TETHER_GATEWAY_PUBLIC_URL",
         "value": f"http://$(TETHER_GATEWAY_GATEWAY_ID).{GATEWAY_PEERS}.{o.namespace}.svc.{o.cluster_domain}:{PORT}"},
        secret_env("TETHER_GATEWAY_SECRET", GATEWAY_KEYS, "secret"),
        secret_env("TETHER_GATEWAY_ADMIN_KEY", GATEWAY_KEYS, "admin-key"),
        *bus_env("gateway"),
    ]
    container = tether_container(
        "gateway", o, "gateway", env,
        [mount("kafka-ca", CA_DIR), mount("models", MODELS_DIR)],
        {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "8Gi"}},
        ports=[{"name": "http", "containerPort": PORT}],
        startupProbe=http_probe("/health", "http", 2, 150),  # loading the tokenizer, joining the run
        readinessProbe=http_probe("/health", "http", 2, 2),
        livenessProbe=http_probe("/health", "http", 10, 3, timeout=5),
    )
    return [
        ("One DNS name per gateway pod (GATEWAY_REPLICAS-N.GATEWAY_PEERS...), which HAProxy's servers name; "
         "not-ready pods are published too, since HAProxy's own checks decide.".replace(
             "GATEWAY_REPLICAS", GATEWAY_REPLICAS).replace("GATEWAY_PEERS", GATEWAY_PEERS), {
             "apiVersion": "v1", "kind": "Service", "metadata": meta(GATEWAY_PEERS, o, "gateway"),
             "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": labels("gateway"),
                      "ports": [{"name": "http", "port": PORT, "targetPort": "http"}]}}),
        ("Gateways: a StatefulSet, so each replica keeps its name across restarts and rescheduling. Its name is "
         "its gateway id on tether.control (a restarted replica rejoins and drains as itself, and the trainer "
         "never waits for a member that is gone) and its server in HAProxy (the same hash ring on every "
         "HAProxy replica). Any replica serves any rollout (it reads one it does not hold back from the log).", {
             "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": meta(GATEWAY_REPLICAS, o, "gateway"),
             "spec": {
                 "serviceName": GATEWAY_PEERS, "replicas": o.gateway_replicas, "podManagementPolicy": "Parallel",
                 "selector": {"matchLabels": labels("gateway")},
                 "template": {
                     "metadata": {"labels": labels("gateway")},
                     "spec": {
                         "automountServiceAccountToken": False,
                         "securityContext": pod_security(),
                         "terminationGracePeriodSeconds": 90,  # calls in flight finish; then GatewayLeft
                         "affinity": anti_affinity("gateway"),
                         "containers": [container],
                         "volumes": [ca_volume(o), models_volume(), STATE_VOLUME],
                     }}}}),
        ("Voluntary disruptions (drains, upgrades) take one gateway at a time.", pdb(GATEWAY_REPLICAS, o, "gateway")),
    ]


def haproxy_config(o: Options) -> str:
    """infra/loadbalancer.py's configuration, its servers being the gateway pods by DNS name."""
    if o.gateway_slots < o.gateway_replicas:
        raise ValueError("gateway slots must be at least the gateway replicas: HAProxy would never route to the "
                         "others")
    base = loadbalancer.config(port=PORT, replicas=[], host="0.0.0.0").rstrip()
    if base.rfind("\nbackend gateways\n") < base.rfind("\nfrontend "):
        raise ValueError("infra/loadbalancer.py's backend is no longer its last section: servers go into it here")
    servers = "\n".join(f"    server {GATEWAY_REPLICAS}-{i} {o.pod_dns(i)}:{PORT} check resolvers cluster "
                        "init-addr none" for i in range(o.gateway_slots))
    return f"""{base}
    # Every pod the StatefulSet may have, by its stable DNS name: one not running does not resolve and is
    # left out of the hash ring; the ring (server ids) is the same on every HAProxy replica.
{servers}

resolvers cluster
    parse-resolv-conf
    hold valid 5s
    hold nx 5s
    hold obsolete 5s
    timeout resolve 1s
    timeout retry 1s
    resolve_retries 3

frontend lb_health
    bind 0.0.0.0:{LB_HEALTH_PORT}
    monitor-uri /healthz
    monitor fail if {{ nbsrv(gateways) lt 1 }}
"""


def gateway_lb(o: Options) -> list[Doc]:
    cfg = haproxy_config(o)
    digest = hashlib.sha256(cfg.encode()).hexdigest()[:16]
    container = {
        "name": "haproxy", "image": o.haproxy_image,
        "command": ["haproxy", "-W", "-db", "-f", "/usr/local/etc/haproxy/haproxy.cfg"],
        "ports": [{"name": "http", "containerPort": PORT}, {"name": "health", "containerPort": LB_HEALTH_PORT}],
        "readinessProbe": http_probe("/healthz", "health", 2, 2),  # ready while a gateway is up
        "livenessProbe": {"tcpSocket": {"port": "http"}, "periodSeconds": 10, "failureThreshold": 3},
        "volumeMounts": [mount("config", "/usr/local/etc/haproxy")],
        "resources": {"requests": {"cpu": "500m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}},
        "securityContext": container_security(),
    }
    return [
        ("HAProxy's configuration: infra/loadbalancer.py's rules (the rollout from the path or the id inside the "
         "rollout token, consistent hashing, /health checks every 0.5 s, failed connections resent to another "
         "replica).", {
             "apiVersion": "v1", "kind": "ConfigMap", "metadata": meta(GATEWAY_LB, o, "gateway-lb"),
             "data": {"haproxy.cfg": cfg}}),
        ("Rollout affinity: a Service's ClientIP affinity pins a client address, not a rollout (every harness pod "
         "has its own address, and the controller calls for every rollout from one), so HAProxy hashes each "
         "request on its rollout, as `tether up` does locally. Its replicas share the configuration, hence the "
         "hash ring.", {
             "apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta(GATEWAY_LB, o, "gateway-lb"),
             "spec": {
                 "replicas": o.lb_replicas, "selector": {"matchLabels": labels("gateway-lb")},
                 "template": {
                     "metadata": {"labels": labels("gateway-lb"),
                                  "annotations": {"tether.dev/haproxy-cfg-sha256": digest}},  # rolls on a change
                     "spec": {
                         "automountServiceAccountToken": False,
                         "securityContext": pod_security(HAPROXY_USER_ID),
                         "affinity": anti_affinity("gateway-lb"),
                         "containers": [container],
                         "volumes": [{"name": "config", "configMap": {"name": GATEWAY_LB}}],
                     }}}}),
        ("The gateway's address: harnesses (TETHER_CONTROLLER_HARNESS_GATEWAY_URL) and the controller's admin API "
         "(TETHER_CONTROLLER_GATEWAY_URL) both go through HAProxy.", {
             "apiVersion": "v1", "kind": "Service", "metadata": meta(GATEWAY, o, "gateway-lb"),
             "spec": {"selector": labels("gateway-lb"),
                      "ports": [{"name": "http", "port": PORT, "targetPort": "http"}]}}),
        ("", pdb(GATEWAY_LB, o, "gateway-lb")),
    ]
