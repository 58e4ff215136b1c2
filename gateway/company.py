"""Which other gateways are alive, from their GatewayJoined and GatewayLeft on tether.control.

A replica's peer watcher (`peers.py`) exists for the calls other gateways
write to the rollouts it holds. A gateway with no other alive has none to
read, and following tether.calls then costs each of its own calls a fetch
answered and a fetch sent (half a millisecond at one client here), so the
watcher stops while it is alone and, when another appears, reads the log from
just before that one's first GatewayJoined. Pure: the control loop tells it
what it read, the watcher asks it; times are passed in, never read here.

A gateway counts from its GatewayJoined (repeated every heartbeat as a lease)
until its GatewayLeft (its own, or the trainer's on its behalf) or until
`lease_s` passes without another. Only the run's own gateways count: a
rollout belongs to one run, and its harness is given that run's gateways.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class _Peer:
    since: float  # its first GatewayJoined of this stay: nothing it wrote is older (its own clock, epoch seconds)
    seen: float  # its latest sign of life (epoch seconds)


class Company:
    def __init__(self, gateway_id: str, lease_s: float) -> None:
        self.gateway_id, self.lease_s = gateway_id, lease_s
        self.known = False  # the control log read to its end: until then nobody can be said to be absent
        self._peers: dict[str, _Peer] = {}

    def joined(self, gateway_id: str, joined_at: float, now: float | None = None) -> None:
        """A GatewayJoined; `now`, when it is read live, is when it arrived (a history's events count by their
        own time, a live one by its arrival, so another host's clock cannot shorten its lease)."""
        if gateway_id == self.gateway_id:
            return
        seen = joined_at if now is None else max(joined_at, now)
        peer = self._peers.get(gateway_id)
        if peer is None or seen - peer.seen > self.lease_s:  # new, or back after its lease ran out: a new stay
            self._peers[gateway_id] = _Peer(since=joined_at, seen=seen)
        else:
            peer.seen = max(peer.seen, seen)

    def left(self, gateway_id: str) -> None:
        self._peers.pop(gateway_id, None)

    def others(self, now: float) -> dict[str, float]:
        """The others alive at `now`, each with the start of its stay; the expired are forgotten."""
        for gateway_id in [g for g, p in self._peers.items() if now - p.seen > self.lease_s]:
            del self._peers[gateway_id]
        return {g: p.since for g, p in self._peers.items()}

    def alone(self, now: float) -> bool:
        return self.known and not self.others(now)

    def arrived_since(self, now: float) -> float | None:
        """The earliest start among the others alive: what one of them wrote cannot be older than this."""
        return min(self.others(now).values(), default=None)
