"""The chaos bench's view of the topics, followed live through the run.

The bench measures recovery by what the parts publish (the next task group, the next weight version, the next
rollout launched) and checks that versions kept advancing; reading the topics back only at the end would lose
when each event arrived. So a thread follows them from the start, noting the wall clock of every event of the
run, and answers the report's questions about times.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

from schemas import topics
from schemas.consumer import EventConsumer
from schemas.events import Event, RolloutStarted, WeightVersionPublished
from schemas.producer import EventProducer
from schemas.settings import BusSettings


class Monitor(threading.Thread):
    """Follows tether.samples, tether.control and tether.rollouts from the start, noting when each of the run's
    events arrived (wall clock): task groups emitted, versions published, rollouts launched."""

    def __init__(self, bus: Callable[[], BusSettings], run_id: str) -> None:
        """`bus`: the settings once the cluster is up (a secured one makes its users as it starts)."""
        super().__init__(daemon=True, name="monitor")
        self.bus, self.run_id = bus, run_id
        self.seen: list[tuple[float, Event]] = []
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            asyncio.run(self._follow())
        except BaseException as exc:  # reported with the checks
            self.error = exc

    async def _follow(self) -> None:
        wanted = [topics.SAMPLES, topics.CONTROL, topics.ROLLOUTS]
        bus = self.bus()
        async with EventProducer(bus) as dlq, \
                EventConsumer(bus, wanted, dlq, name=f"chaos-monitor-{self.run_id}") as consumer:
            async for batch in consumer.batches(timeout_ms=300):
                now = time.time()
                self.seen += [(now, r.event) for r in batch if getattr(r.event, "run_id", None) == self.run_id]
                if self.stopping.is_set():
                    return

    @staticmethod
    def stamp(at: float, event: Event) -> float:
        """When it happened: the event's own time where its writer stamps it at writing (a version published, a
        rollout launched), else when the monitor read it (a task group's created_at is its data's, for replays)."""
        if isinstance(event, WeightVersionPublished):
            return event.published_at.timestamp()
        if isinstance(event, RolloutStarted):
            return event.started_at.timestamp()
        return at

    def first_after(self, kind: type[Event], t: float) -> float | None:
        return min((self.stamp(at, e) for at, e in list(self.seen) if isinstance(e, kind)
                    and self.stamp(at, e) > t), default=None)

    def lag(self) -> float:
        """The longest a published version took to reach the monitor: how far arrival times can be trusted."""
        return max((at - e.published_at.timestamp() for at, e in list(self.seen)
                    if isinstance(e, WeightVersionPublished)), default=0.0)

    def versions(self) -> list[tuple[float, int]]:
        return sorted((e.published_at.timestamp(), e.version) for _, e in list(self.seen)
                      if isinstance(e, WeightVersionPublished))

    def version_at(self, t: float) -> int:
        return max((v for at, v in self.versions() if at <= t), default=0)
