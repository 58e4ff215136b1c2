"""HAProxy in front of gateway replicas: what a Kubernetes Service with session affinity does on a cluster.

Every request is hashed on its rollout (the id in a `/rollouts/{id}/...` or
`/admin/rollouts/{id}/...` path, else the id inside the rollout token in
`Authorization: Bearer` or `x-api-key`), with consistent hashing, so a
rollout's calls go to one replica and move only when that replica is down.
Health checks every half second take a dead replica out after two misses; a
request whose connection fails is sent to another replica (it never reached
the dead one, so resending it cannot double a call). A request that a replica
was serving when it died is answered 502 and retried by the harness's SDK,
which lands on a live replica; that replica reads the rollout back from the
log (`gateway.readback`).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from infra.errors import InfraError

_ROLLOUT = ("http-request set-var(txn.rollout) {source} if {condition}")
_KEYS = [
    ("path,field(3,/),url_dec", "{ path_beg /rollouts/ }"),
    ("path,field(4,/),url_dec", "{ path_beg /admin/rollouts/ }"),
    ('req.hdr(authorization),word(2," "),field(2,.),ub64dec',
     "!{ var(txn.rollout) -m found } { req.hdr(authorization) -m found }"),
    ("req.hdr(x-api-key),field(2,.),ub64dec", "!{ var(txn.rollout) -m found } { req.hdr(x-api-key) -m found }"),
]


def haproxy() -> str:
    """The HAProxy executable (Debian's `haproxy` package)."""
    found = shutil.which("haproxy") or next((p for p in ("/usr/sbin/haproxy",) if Path(p).exists()), None)
    if found is None:
        raise InfraError("HAProxy is not installed: gateway replicas need it in front (Debian: apt-get install "
                         "haproxy)")
    return found


def config(*, port: int, replicas: list[tuple[str, int]], host: str = "127.0.0.1") -> str:
    """haproxy.cfg for `replicas` (name, port) behind `host:port`."""
    rules = "\n".join(f"    {_ROLLOUT.format(source=s, condition=c)}" for s, c in _KEYS)
    servers = "\n".join(f"    server {name} 127.0.0.1:{p} check" for name, p in replicas)
    return f"""# Written by tether: gateway replicas behind one address, each rollout on one replica while it is up.
global
    maxconn 8192

defaults
    mode http
    timeout connect 1s
    timeout client 15m
    timeout server 15m
    retries 3
    option redispatch 1
    retry-on conn-failure

frontend tether_gateway
    bind {host}:{port}
{rules}
    default_backend gateways

backend gateways
    balance hash var(txn.rollout)
    hash-type consistent
    option httpchk GET /health
    http-check expect status 200
    default-server inter 500ms fall 2 rise 2
{servers}
"""
