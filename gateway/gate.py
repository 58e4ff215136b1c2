"""Pause, drain, resume: the gateway's side of a collocated weight update.

While paused, new calls wait at the gate (queued, not rejected) for at most
`max_hold_s`; calls already inside finish on the old weights. `drained()`
returns once nothing is inside, which is when the trainer may change weights.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from gateway.errors import HeldTooLong


class Gate:
    def __init__(self, max_hold_s: float) -> None:
        self.max_hold_s = max_hold_s
        self.in_flight = 0
        self.held = 0
        self.paused_for: int | None = None  # the version an update is moving to
        self._open = asyncio.Event()
        self._open.set()
        self._empty = asyncio.Event()
        self._empty.set()

    @asynccontextmanager
    async def admit(self) -> AsyncIterator[float]:
        """Enter (waiting while paused); yields the seconds spent held."""
        started = time.monotonic()
        if not self._open.is_set():
            self.held += 1
            try:
                async with asyncio.timeout(self.max_hold_s):
                    await self._open.wait()
            except TimeoutError:
                raise HeldTooLong(
                    f"a weight update has held this call for {self.max_hold_s:.0f}s; try again shortly",
                    retry_after_s=max(1.0, self.max_hold_s / 4),
                ) from None
            finally:
                self.held -= 1
        self.in_flight += 1
        self._empty.clear()
        try:
            yield time.monotonic() - started
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self._empty.set()

    def pause(self, version: int) -> None:
        self.paused_for = version
        self._open.clear()

    async def drained(self) -> None:
        await self._empty.wait()

    def resume(self) -> None:
        self.paused_for = None
        self._open.set()

    @property
    def paused(self) -> bool:
        return not self._open.is_set()
