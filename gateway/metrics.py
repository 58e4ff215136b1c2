"""Prometheus metrics of one gateway process, served on /metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class Metrics:
    """Its own registry, so two gateways in one test process do not collide."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("tether_gateway_requests", "Model calls received", ["api"], registry=r)
        self.errors = Counter("tether_gateway_errors", "Model calls that failed", ["api", "status"], registry=r)
        self.refused = Counter("tether_gateway_refused_requests",
                               "Requests a route answered with an error status, parse errors included (a model "
                               "call refused before admission is recorded nowhere else)", ["route", "status"],
                               registry=r)
        self.latency = Histogram("tether_gateway_call_seconds", "Call latency, held time included", ["api"],
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.publish_latency = Histogram("tether_gateway_kafka_publish_seconds", "Kafka acknowledgement wait",
                                         buckets=LATENCY_BUCKETS, registry=r)
        self.tokens = Counter("tether_gateway_tokens", "Tokens through the gateway", ["kind"], registry=r)
        self.reused_turns = Counter("tether_gateway_reused_turns",
                                    "Assistant turns rendered from the ids the model generated", registry=r)
        self.resumed_renders = Counter("tether_gateway_resumed_renders",
                                       "Prompts rendered from the rollout's previous call on", registry=r)
        self.render_mismatches = Counter("tether_gateway_render_mismatches",
                                         "Checked prompts that differed from the whole rendering",
                                         registry=r)
        self.restored = Counter("tether_gateway_restored_rollouts",
                                "Rollouts this process did not hold, read back from the log", registry=r)
        self.forgotten = Counter("tether_gateway_forgotten_rollouts",
                                 "Rollouts dropped from memory because another replica wrote for them", registry=r)
        self.held = Gauge("tether_gateway_held_calls", "Calls waiting for a weight update", registry=r)
        self.in_flight = Gauge("tether_gateway_in_flight_calls", "Calls being served", registry=r)
        self.peer_watch = Gauge("tether_gateway_peer_watch",
                                "1 while tether.calls is followed as written for other gateways' writes; 0 while none "
                                "of the run is alive and it is read once a second",
                                registry=r)
        self.weight_version = Gauge("tether_gateway_weight_version", "Last weight version published", registry=r)
