"""Python's cyclic garbage collector, tuned for services that hold a large heap and readers that build one.

Events, calls and states hold no reference cycles, yet every young collection
that promotes them brings full collections that walk the whole heap: an eighth
of the gateway's CPU at 64 clients, and half of a replay's read time.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

YOUNG = 20_000  # allocations between young collections (Python's default: 700)


def settle(young: int = YOUNG) -> None:
    """For a service once started: what start-up loaded lives as long as the process, so it is frozen out of the
    collector's sight, and a larger first generation runs the collector less often for short-lived objects."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(young, *gc.get_threshold()[1:])


@contextmanager
def collector_paused() -> Iterator[None]:
    """For a bulk read (a replay): no collection while it builds its objects; they are freed by reference counts
    as ever, and the collector runs again afterwards."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
