"""Faust's table recovery, with the consumer's flow stopped while it hands over to the streams.

When a worker has restored its tables from their changelogs, Faust resumes
the source partitions, seeks them to their committed offsets, then resumes
flow, which empties the streams' queues. The fetcher runs all the while: a
record fetched before the seek can be delivered after it (moving the
partition's read offset past records not yet delivered), and what reached a
queue is dropped when flow resumes; the same records fetched again are then
below the read offset and skipped as seen. Records waiting on the source topics
when a worker restarts were lost so (a RolloutFinished among them left its
rollout open for good: tests/test_processors.py). Stopping the consumer's flow
first cuts short a delivery in flight and holds the fetcher until Faust has
sought, emptied the queues and resumed flow itself.
"""

from __future__ import annotations

from faust.tables import TableManager
from faust.tables.recovery import Recovery


class FlowStoppedRecovery(Recovery):
    async def on_recovery_completed(self, generation_id: int = 0) -> None:
        self.app.consumer.stop_flow()
        await super().on_recovery_completed(generation_id)


class Tables(TableManager):
    """The app's table manager (`App(TableManager=...)`), with the recovery above."""

    @property
    def recovery(self) -> Recovery:
        if self._recovery is None:
            self._recovery = FlowStoppedRecovery(self.app, self, beacon=self.beacon, loop=self.loop)
        return self._recovery
