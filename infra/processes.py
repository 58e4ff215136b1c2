"""Operating-system process helpers, written once: pid files that survive pid reuse, liveness, stopping a
process group, log tails; plus free ports, health waits and sure stops for servers run as children.

The controller's local runner, the `tether` command's stack (`tether up`) and the Kafka launcher all start
processes that outlive the process that started them and must be found, checked and stopped again later.
These helpers live here, not in the shared kernel (`schemas/`, the event contract), because they are about
the machine, not about events. The controller may import this module: `infra` is not a service (it has no
topic and no HTTP API, so importing it couples the controller to no other service), and this module depends
on nothing but the standard library, httpx (which the controller already uses) and `infra.errors`.

The zygote (`controller/runners/zygote.py`) does not use it: it runs under the harness's own interpreter with
the standard library only, and writes its exit codes itself (128+N for a death by signal N, as `sh` reports).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from infra.errors import InfraError

KILL_WAIT_S = 10.0  # how long a group may take to vanish after SIGKILL (a process in uninterruptible sleep)


class ServerStartFailed(InfraError):
    """A child server exited or never answered its health check."""


# -- identity: a pid and the kernel's start time name one process ----------------


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (which may hold spaces and parentheses)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def start_time(pid: int) -> str | None:
    """When the kernel started `pid` (field 22 of its stat), None if there is no such process. With the pid it
    names one process, so a recycled pid is not mistaken for the process we started."""
    fields = _stat(pid)
    return fields[19] if fields is not None and len(fields) > 19 else None


def write_pid_file(path: Path, pid: int) -> None:
    """`PID START-TIME`, read back by `running_pid`."""
    path.write_text(f"{pid} {start_time(pid)}\n")


def running_pid(path: Path) -> int | None:
    """The pid a pid file names while that very process exists (a zombie not yet reaped still exists)."""
    try:
        pid, started = path.read_text().split()
        number = int(pid)
    except (OSError, ValueError):
        return None
    return number if start_time(number) == started else None


# -- liveness -----------------------------------------------------------------------


def reap(pid: int) -> None:
    """Collect the exit status of `pid` if it is our exited child (else nothing), so it is not left a zombie."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def alive(pid: int) -> bool:
    """Whether one process runs; reaps it first if it is our exited child, and a zombie counts as dead."""
    reap(pid)
    if not _send(os.kill, pid, 0):
        return False
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def group_alive(pgid: int) -> bool:
    """Whether any process of the group still runs (a zombie does not)."""
    if not signal_group(pgid, 0):
        return False
    leader = _stat(pgid)
    if leader is not None and leader[0] != "Z":
        return True  # the common case, one read: the leader itself runs
    return any(_runs_in(pid, pgid) for pid in _pids())


def _pids() -> list[int]:
    try:
        return [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []


def children_of(pid: int) -> list[int]:
    """The processes whose parent is `pid` (zombies included: they still need reaping)."""
    return [child for child in _pids() if (fields := _stat(child)) is not None and len(fields) > 1
            and fields[1] == str(pid)]


def _runs_in(pid: int, pgid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z"


# -- stopping a process group ---------------------------------------------------------


def signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` (0: none, a probe) to the group; False if it has gone. One we may not signal (another user's
    process) counts as there, and is left to its own end."""
    return _send(os.killpg, pgid, sig)


def _send(kill: Callable[[int, int], None], target: int, sig: int) -> bool:
    try:
        kill(target, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_group(pgid: int, grace_s: float, *, first: signal.Signals = signal.SIGTERM, poll_s: float = 0.1) -> None:
    """`first` (TERM) to the whole group, SIGKILL to what is left after `grace_s`, then wait (briefly) until it has
    gone. The group outlives its leader, so it is signalled even once the leader has exited. Reaps the leader
    if it is this process's child. For synchronous callers (the stack, the broker); see `stop_group_async`."""
    if not signal_group(pgid, first):
        return
    if _vanishes(pgid, grace_s, poll_s):
        return
    signal_group(pgid, signal.SIGKILL)
    _vanishes(pgid, KILL_WAIT_S, poll_s)


def _vanishes(pgid: int, within_s: float, poll_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while True:
        reap(pgid)  # our own exited leader would otherwise linger as a zombie
        if not group_alive(pgid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)


async def stop_group_async(pgid: int, grace_s: float, poll_s: float = 0.05) -> None:
    """TERM to the group, SIGKILL after `grace_s`, without blocking the event loop. It never reaps: asyncio's
    child watcher owns the exit status of the children it started (the caller awaits its own child)."""
    signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while group_alive(pgid) and time.monotonic() < deadline:  # noqa: ASYNC110  # a group has no handle to await
        await asyncio.sleep(poll_s)
    if group_alive(pgid):  # a group gone is a number that may be reused: never signal it blindly
        signal_group(pgid, signal.SIGKILL)


# -- starting and watching --------------------------------------------------------------


def spawn(argv: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start `argv` in a session of its own (its group can be stopped whole, and the terminal's Ctrl-C does not
    reach it), stdin closed, stdout and stderr appended to `log`."""
    with log.open("ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)


def tail(log: Path, lines: int = 5) -> str:
    """The last lines of a log on one line, for an error message that says why a process died."""
    try:
        return " | ".join(log.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return "(no log)"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def free_port_block(span: int = 30) -> int:
    """A base port with base..base+span-1 all free on loopback, for a server that takes several ports at fixed
    offsets from one base: node K of a Kafka cluster uses base + 10*(K-1) + 0..2 (client, controller,
    inter-broker). Picked at random below the ephemeral range, so a port the kernel hands out meanwhile does not
    land in the block."""
    for _ in range(200):
        base = random.randrange(20_000, 32_000, 10)
        try:
            for port in range(base, base + span):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError("no free block of ports")


def wait_healthy(url: str, process: subprocess.Popen[bytes], what: str, timeout_s: float = 180,
                 log: Path | None = None) -> None:
    """Until GET {url}/health answers 200; a clear error naming `what` if it exits or times out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServerStartFailed(f"{what} exited with {process.returncode}{_last_lines(log)}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.3)
    stop(process)
    raise ServerStartFailed(f"{what} did not answer {url}/health within {timeout_s:.0f}s{_last_lines(log)}")


def stop(process: subprocess.Popen[bytes], grace_s: float = 30) -> None:
    """Terminate, and kill if it has not gone after `grace_s`: nothing is left behind."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=grace_s)


def _last_lines(log: Path | None) -> str:
    if log is None or not log.exists():
        return ""
    return f"; last log lines: {tail(log)}"
