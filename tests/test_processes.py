"""Stopping process groups: a group is signalled only while it exists, since a vanished group's number can be
handed to a stranger (a Ray worker leads its own group)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Coroutine
from typing import Any

import pytest

from infra import processes


def _recording(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    sent: list[tuple[int, int]] = []
    real = os.killpg

    def killpg(pgid: int, sig: int) -> None:
        sent.append((pgid, sig))
        real(pgid, sig)

    monkeypatch.setattr(os, "killpg", killpg)  # infra.processes calls it through the os module
    return sent


def test_a_group_that_ends_on_sigterm_is_never_sent_sigkill(monkeypatch: pytest.MonkeyPatch) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    sent = _recording(monkeypatch)
    assert asyncio.run(_stopped(child, processes.stop_group_async(child.pid, grace_s=30.0, poll_s=0.01))) == \
        -signal.SIGTERM
    assert (child.pid, signal.SIGKILL) not in sent and (child.pid, signal.SIGTERM) in sent


async def _stopped(child: subprocess.Popen[bytes], stopping: Coroutine[Any, Any, None]) -> int:
    """Reap the child as it dies (as asyncio's watcher would), while the group is being stopped."""
    reaper = asyncio.create_task(asyncio.to_thread(child.wait))
    await stopping
    return await reaper


def test_a_group_that_ignores_sigterm_gets_sigkill_after_the_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                              "signal.SIG_IGN); print(flush=True); time.sleep(60)"], start_new_session=True,
                             stdout=subprocess.PIPE)
    assert child.stdout is not None and child.stdout.readline()  # its handler is set
    sent = _recording(monkeypatch)
    assert asyncio.run(_stopped(child, processes.stop_group_async(child.pid, grace_s=0.3, poll_s=0.01))) == \
        -signal.SIGKILL
    assert sent[-1] == (child.pid, signal.SIGKILL)
