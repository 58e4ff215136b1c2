"""Where this process's calls landed on tether.calls: written by the recorder as Kafka acknowledges them, read
by the peer watcher to pass over its own records undecoded."""

from __future__ import annotations


class OwnWrites:
    """Where this process's calls landed on tether.calls (partition, offset), as Kafka acknowledged them; bounded
    (a record the watcher read before its acknowledgement came is decoded instead, and its entry ages out)."""

    def __init__(self, limit: int = 100_000) -> None:
        self._at: dict[tuple[int, int], None] = {}
        self.limit = limit

    def add(self, partition: int, offset: int) -> None:
        self._at[(partition, offset)] = None
        if len(self._at) > self.limit:
            del self._at[next(iter(self._at))]

    def pop(self, partition: int, offset: int) -> bool:
        """Whether it was ours (forgotten then: each record is read once)."""
        return self._at.pop((partition, offset), 0) is None
