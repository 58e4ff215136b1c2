"""The supervisor keeps a server's port listening across its deaths: what arrives meanwhile waits, none is refused."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from infra.processes import alive, children_of, free_port, stop
from infra.supervisor import Policy

# A server as the supervisor expects one: it takes the inherited socket, says it is ready, and answers each
# connection with its pid. READY_AFTER_S delays the "ready"; EXIT_AT_START makes it die before it.
SERVER = textwrap.dedent("""
    import os, sys, time
    from infra.supervisor import inherited_socket, notify_ready
    if os.environ.get("EXIT_AT_START"):
        sys.exit(int(os.environ["EXIT_AT_START"]))
    sock = inherited_socket()
    assert sock is not None and "TETHER_LISTEN_FD" not in os.environ
    time.sleep(float(os.environ.get("READY_AFTER_S", "0")))
    notify_ready()
    while True:
        conn, _ = sock.accept()
        conn.recv(16)
        conn.sendall(str(os.getpid()).encode())
        conn.close()
""")


@contextmanager
def supervised(tmp_path: Path, *flags: str, **env: str) -> Iterator[tuple[subprocess.Popen[bytes], int, Path]]:
    port, log = free_port(), tmp_path / "supervisor.log"
    (tmp_path / "server.py").write_text(SERVER)
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "infra.supervisor", "--port", str(port), *flags, "--", sys.executable,
             str(tmp_path / "server.py")], stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent), **env}, start_new_session=True)
    try:
        wait_for(lambda: "started " in log.read_text() or process.poll() is not None)  # it listens from here on
        yield process, port, log
    finally:
        stop(process, grace_s=10)


def ask(port: int, timeout_s: float = 30) -> int:
    """The pid of the server that answered a connection made now."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as conn:
        conn.sendall(b"who")
        return int(conn.recv(16))


def wait_for(condition: Callable[[], bool], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_connection_made_while_the_server_is_dead_waits_for_the_next_one(tmp_path: Path) -> None:
    with supervised(tmp_path, READY_AFTER_S="1.0") as (supervisor, port, log):
        first = ask(port)
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: not alive(first))
        started = time.monotonic()
        second = ask(port)  # refused without the held socket: nothing listens until the next server is up
        assert second != first and second in children_of(supervisor.pid)
        assert time.monotonic() - started >= 0.9  # it was served by a server that became ready after it came
        assert ask(port) == second
    text = log.read_text()
    assert f"server (pid {first}) exited with signal SIGKILL" in text and "restart 1 in" in text, text
    assert text.count("ready in") == 2


def test_sigterm_reaches_the_server_once_and_nothing_restarts(tmp_path: Path) -> None:
    with supervised(tmp_path) as (supervisor, port, log):
        server = ask(port)
        supervisor.send_signal(signal.SIGTERM)
        assert supervisor.wait(timeout=10) == 128 + signal.SIGTERM  # the server died of it, as told
        assert not alive(server)
        with pytest.raises(ConnectionRefusedError):
            ask(port, timeout_s=2)
    assert "restart" not in log.read_text()


def test_a_killed_supervisor_takes_its_server_along(tmp_path: Path) -> None:
    """No orphan keeps the port: `tether up` can start the service again."""
    with supervised(tmp_path) as (supervisor, port, _):
        server = ask(port)
        supervisor.kill()
        supervisor.wait()
        wait_for(lambda: not alive(server), timeout_s=10)
        with socket.socket() as again:
            again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            again.bind(("127.0.0.1", port))


def test_a_server_that_never_comes_up_is_not_restarted(tmp_path: Path) -> None:
    with supervised(tmp_path, EXIT_AT_START="3") as (supervisor, _, log):
        assert supervisor.wait(timeout=30) == 3
    text = log.read_text()
    assert "on its first start, before it was ready: giving up" in text and text.count("started ") == 1, text


def test_a_server_that_keeps_dying_is_given_up_on(tmp_path: Path) -> None:
    with supervised(tmp_path, "--max-quick-restarts", "2") as (supervisor, port, log):
        for _ in range(3):
            server = ask(port)
            os.kill(server, signal.SIGKILL)
            wait_for(lambda: not alive(server))  # noqa: B023  # (a connection it accepted while dying is reset)
        assert supervisor.wait(timeout=30) == 1
    text = log.read_text()
    assert "3 times in a row soon after its start: giving up" in text, text


def test_a_port_in_use_is_one_line_and_an_error(tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        result = subprocess.run([sys.executable, "-m", "infra.supervisor", "--port", str(port), "--", "true"],
                                capture_output=True, text=True, timeout=30)
    assert result.returncode == 1 and f"cannot listen on 127.0.0.1:{port}" in result.stderr


@given(st.integers(0, 50))
def test_restart_delays_grow_and_are_bounded(quick: int) -> None:
    policy = Policy()
    assert 0 <= policy.delay(quick) <= policy.max_delay_s
    assert policy.delay(quick) <= policy.delay(quick + 1)
    assert (policy.delay(quick) == 0) == (quick == 0)  # a server that had been up is started again at once
