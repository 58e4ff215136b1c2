"""Which engine replicas a call may go to: those that answer and hold at least the version the gateway stamps.

A replica that restarted serves its launch weights (version 0) until the
trainer brings it up to the current version (`trainer/engines/fleet.py`,
within its `check_every_s`); until then a call routed to it would be served
by weights other than the ones its record names. The gateway asks each
replica which version it holds, in the engine's own API, every
`engine_check_s`, and routes around those behind or silent. A replica ahead
of the gateway is in a hand-over, while the gateway holds calls anyway.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

EngineKind = Literal["tether", "vllm", "sglang"]

# The route that says which weights a replica holds, and the field that says it, per engine
VERSION_ROUTE: dict[str, tuple[str, str]] = {
    "tether": ("/v1/weights", "version"),
    "vllm": ("/weight_info", "weight_version"),  # "default" until the trainer labels it
    "sglang": ("/model_info", "weight_version"),
}


def held_version(kind: str, body: Mapping[str, Any]) -> int:
    """The run version a replica's answer names; a label that is no version (vLLM's and SGLang's "default" at
    launch) means the launch weights, version 0."""
    text = str(body.get(VERSION_ROUTE[kind][1]))
    return int(text) if text.isdigit() else 0


def routable(held: Mapping[str, int | None], current: int, answered_before: bool) -> set[str]:
    """Replicas that answered (None: they did not) with at least `current`. If none did, but some replica ever
    answered the version route (now or before: one that is down may come back on its launch weights): no
    replica, and calls wait for the trainer to bring one up. If no replica ever answered it (an engine without
    the route): every replica, so calls go as they would without this check."""
    ready = {url for url, version in held.items() if version is not None and version >= current}
    if ready or answered_before or any(version is not None for version in held.values()):
        return ready
    return set(held)
