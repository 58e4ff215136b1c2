"""Whether any other gateway of the run is alive, from their GatewayJoined and GatewayLeft on tether.control.

A replica's peer watcher (`peers.py`) reads tether.calls for the calls other
gateways write to the rollouts it holds. With none alive it need not read them
as they are written: following the topic costs a lone gateway a fetch
answered and a fetch sent for each of its own calls (half a millisecond at one
client here), so it reads it in a batch once a second instead. This only says
how soon the watcher reads, never what: every record is read either way. Pure:
the control loop tells it what it read, the watcher asks it; times are passed
in, never read here.

A gateway counts from its GatewayJoined (repeated every heartbeat as a lease)
until its GatewayLeft (its own, or the trainer's on its behalf) or until
`lease_s` passes without another. Only the run's own gateways count: a
rollout belongs to one run, and its harness is given that run's gateways.
"""

from __future__ import annotations


class Company:
    def __init__(self, gateway_id: str, lease_s: float) -> None:
        self.gateway_id, self.lease_s = gateway_id, lease_s
        self._known = False  # the control log read to its end: until then nobody can be said to be absent
        self._seen: dict[str, float] = {}  # the others, by their latest sign of life (epoch seconds)

    def history_read(self) -> None:
        """The control log is read to its end: from now on a gateway not seen is absent."""
        self._known = True

    def joined(self, gateway_id: str, joined_at: float, now: float | None = None) -> None:
        """A GatewayJoined; `now`, when it is read live, is when it arrived (a history's events count by their
        own time, a live one by its arrival, so another host's clock cannot shorten its lease)."""
        if gateway_id != self.gateway_id:
            seen = joined_at if now is None else max(joined_at, now)
            self._seen[gateway_id] = max(seen, self._seen.get(gateway_id, seen))

    def left(self, gateway_id: str) -> None:
        self._seen.pop(gateway_id, None)

    def alone(self, now: float) -> bool:
        """No other gateway of the run alive at `now` (and the control log read: never before)."""
        for gateway_id in [g for g, seen in self._seen.items() if now - seen > self.lease_s]:
            del self._seen[gateway_id]
        return self._known and not self._seen
