"""Long work as people can follow it: a rich bar on a terminal; plain lines in a log (`make run | tee`, CI), where
a bar prints nothing until the end."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.progress import Progress

from tether.cli.support import progress_bar


class Shown(AbstractContextManager["Shown"]):
    """`update(completed, detail)` moves the bar, or prints `description: N/TOTAL detail (elapsed)`: when the
    count moves (at most one line per `gap_s`, and always the last), and every `every_s` while it does not, so a
    quiet log still says it is alive."""

    def __init__(self, console: Console, description: str, total: int, *, every_s: float = 30.0,
                 gap_s: float = 5.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.console, self.description, self.total, self.every_s, self.gap_s, self.clock = (
            console, description, total, every_s, gap_s, clock)
        self._bar: Progress | None = None
        self._job: Any = None
        self._started = self._said_at = clock()
        self._said: int | None = None

    def __enter__(self) -> Shown:
        self._started = self._said_at = self.clock()
        if self.console.is_terminal:
            self._bar = progress_bar(self.console)
            self._bar.__enter__()
            self._job = self._bar.add_task(self.description, total=self.total, detail="")
        return self

    def update(self, completed: int, detail: str = "") -> None:
        if self._bar is not None:
            self._bar.update(self._job, completed=completed, detail=detail)
            return
        now = self.clock()
        moved = completed != self._said and (now - self._said_at >= self.gap_s or completed >= self.total
                                             or self._said is None)
        if moved or now - self._said_at >= self.every_s:
            self._said, self._said_at = completed, now
            self.console.print(f"{self.description}: {completed}/{self.total} {detail} ({now - self._started:.0f} s)",
                               highlight=False, soft_wrap=True)

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if self._bar is not None:
            self._bar.__exit__(kind, error, trace)


@contextmanager
def status(console: Console, text: str) -> Iterator[None]:
    """A spinner on a terminal; one line saying what starts, elsewhere."""
    if not console.is_terminal:
        console.print(text, highlight=False, soft_wrap=True)
    spinner: AbstractContextManager[Any] = console.status(text) if console.is_terminal else nullcontext()
    with spinner:
        yield
