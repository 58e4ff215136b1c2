"""A server's listening socket held across its restarts, so that a crash queues connections instead of refusing
them: `python -m infra.supervisor --port P [--host H] -- COMMAND...`.

A harness's SDK retries a refused connection two or three times within about
1.5 s, and then its rollout fails; a gateway takes seconds to start again. So
the socket outlives the server. The supervisor binds and listens, starts the
server with the socket inherited (its number in `TETHER_LISTEN_FD`, read by
`inherited_socket`) and a pipe on which the server says it is ready (its
number in `TETHER_READY_FD`, written by `notify_ready`), and when the server
dies starts it again on the same socket. Meanwhile the kernel completes new connections into the listen
backlog, and the requests sent on them are answered by the next process: the
harness sees a slow answer, not an error. A call that was being served when
the server died is cut, and the SDK's retry lands in the backlog too.

Restarts: a server that dies on its first start before saying it is ready
never came up (a bad setting, a missing model), and the supervisor exits
with its code instead of looping. Later deaths are restarted at once; a death
that comes quickly (before ready, or within `--settle` seconds of it) waits a
delay that doubles from 0.1 s up to 5 s, and after `--max-quick-restarts`
quick deaths in a row the supervisor gives up. Each start's time to ready is
logged.
SIGTERM, SIGINT and SIGHUP are passed on once to the server, which drains and
exits; the supervisor then exits with its code, restarting nothing. The server
leads its own process group (signals to the supervisor's group reach it only
through the supervisor, once) and dies with the supervisor (PR_SET_PDEATHSIG),
so a killed supervisor leaves no server holding the port.

Standard library only: it runs before, and outlives, anything the server
imports.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

#: The variables that name the inherited listening socket's file descriptor, and the pipe to say "ready" on.
LISTEN_FD = "TETHER_LISTEN_FD"
READY_FD = "TETHER_READY_FD"
BACKLOG = 4096  # the kernel caps it at net.core.somaxconn; a restart's worth of calls waits there
_PR_SET_PDEATHSIG = 1

log = logging.getLogger("tether.supervisor")


def listening_socket(host: str, port: int, backlog: int = BACKLOG) -> socket.socket:
    """Bound and listening, inheritable, on `host` (IPv4 or IPv6 address or name) and `port`."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                         flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def inherited_socket() -> socket.socket | None:
    """The listening socket a supervisor handed this process, or None (bind your own). The variable is removed,
    so that nothing this process starts takes the socket for its own."""
    fd = os.environ.pop(LISTEN_FD, None)
    if fd is None:
        return None
    try:
        sock = socket.socket(fileno=int(fd))
    except (ValueError, OSError) as exc:
        raise RuntimeError(f"{LISTEN_FD}={fd!r} names no socket this process holds: {exc}") from exc
    sock.set_inheritable(False)
    return sock


def notify_ready() -> None:
    """Tell the supervisor, if any, that this server now serves (call once, after start-up)."""
    fd = os.environ.pop(READY_FD, None)
    if fd is None:
        return
    with contextlib.suppress(ValueError, OSError):  # a supervisor gone is no reason to stop serving
        os.write(int(fd), b"ready\n")
        os.close(int(fd))


@dataclass(frozen=True)
class Policy:
    """When a dead server is started again."""

    settle_s: float = 10.0  # a death sooner than this after ready (or before it) is quick
    max_quick_restarts: int = 5  # quick deaths in a row before giving up
    first_delay_s: float = 0.1
    max_delay_s: float = 5.0

    def delay(self, quick_deaths: int) -> float:
        if quick_deaths == 0:
            return 0.0
        return min(self.first_delay_s * 2.0 ** (quick_deaths - 1), self.max_delay_s)


@dataclass
class _Life:
    """One start of the server: its process, when it started, and when it said it was ready."""

    child: subprocess.Popen[bytes]
    ready_fd: int
    started: float
    ready: float | None = None


def _die_with_parent(parent: int) -> None:
    """In the child before exec: SIGKILL when the supervisor dies, and a session of its own."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the supervisor died before prctl took effect
        os._exit(1)


def _described(code: int) -> str:
    return f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"


class Supervisor:
    """Runs the server on the socket until it is told to stop (or the server cannot stay up)."""

    def __init__(self, argv: Sequence[str], sock: socket.socket, policy: Policy = Policy()) -> None:
        self.argv = list(argv)
        self.sock = sock
        self.policy = policy
        self.child: subprocess.Popen[bytes] | None = None
        self.stopping: int | None = None  # the signal that asked us to stop

    def _start(self) -> _Life:
        fd = self.sock.fileno()
        parent = os.getpid()
        ready_r, ready_w = os.pipe()
        env = {**os.environ, LISTEN_FD: str(fd), READY_FD: str(ready_w)}
        try:
            child = subprocess.Popen(self.argv, env=env, pass_fds=(fd, ready_w), start_new_session=True,
                                     preexec_fn=lambda: _die_with_parent(parent))  # one thread here: safe
        finally:
            os.close(ready_w)
        self.child = child
        return _Life(child, ready_r, time.monotonic())

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.stopping = signum
        if self.child is not None and self.child.returncode is None:  # not reaped: its group is still its own
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.child.pid, signum)  # the server and anything it started

    def _watch(self, life: _Life) -> int:
        """Until the server exits (its code), noting when it says it is ready."""
        watching = True
        try:
            while (code := life.child.poll()) is None:
                if not watching:
                    time.sleep(0.1)
                    continue
                readable, _, _ = select.select([life.ready_fd], [], [], 0.1)
                if readable:
                    watching = bool(os.read(life.ready_fd, 64))  # empty: the server closed it
                    if watching and life.ready is None:
                        life.ready = time.monotonic()
                        log.info("server (pid %d) ready in %.2f s", life.child.pid, life.ready - life.started)
            return code
        finally:
            os.close(life.ready_fd)

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)
        quick, starts = 0, 0
        while self.stopping is None:
            life = self._start()
            starts += 1
            log.info("started %s (pid %d) on %s", self.argv[0], life.child.pid, self.sock.getsockname()[:2])
            code = self._watch(life)
            ended = time.monotonic()
            if self.stopping is not None:
                log.info("server exited with %s after the supervisor's %s", _described(code),
                         signal.Signals(self.stopping).name)
                return code if code >= 0 else 128 - code
            if life.ready is None and starts == 1:
                log.error("server exited with %s after %.1f s on its first start, before it was ready: giving up",
                          _described(code), ended - life.started)
                return code if code > 0 else 1
            quick = quick + 1 if life.ready is None or ended - life.ready < self.policy.settle_s else 0
            if quick > self.policy.max_quick_restarts:
                log.error("server exited with %s, %d times in a row soon after its start: giving up",
                          _described(code), quick)
                return code if code > 0 else 1
            delay = self.policy.delay(quick)
            log.warning("server (pid %d) exited with %s after %.1f s; restart %d in %.1f s, connections wait "
                        "in the listen backlog", life.child.pid, _described(code), ended - life.started, starts,
                        delay)
            self._sleep(delay)
        return 0

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while self.stopping is None and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, 0.05))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.supervisor", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--settle", type=float, default=Policy.settle_s, help="seconds a first start must last")
    parser.add_argument("--max-quick-restarts", type=int, default=Policy.max_quick_restarts)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the server's command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no server command (put it after --)")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s supervisor %(levelname)s %(message)s")
    try:
        sock = listening_socket(args.host, args.port)
    except OSError as exc:
        log.error("cannot listen on %s:%d: %s", args.host, args.port, exc)
        return 1
    policy = Policy(settle_s=args.settle, max_quick_restarts=args.max_quick_restarts)
    return Supervisor(command, sock, policy).run()


if __name__ == "__main__":
    sys.exit(main())
