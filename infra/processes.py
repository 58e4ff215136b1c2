"""Small helpers for running Tether's servers as child processes: free ports, health waits, clean stops."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import httpx

from infra.errors import InfraError


class ServerStartFailed(InfraError):
    """A child server exited or never answered its health check."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_healthy(url: str, process: subprocess.Popen[bytes], what: str, timeout_s: float = 180,
                 log: Path | None = None) -> None:
    """Until GET {url}/health answers 200; a clear error naming `what` if it exits or times out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServerStartFailed(f"{what} exited with {process.returncode}{_tail(log)}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.3)
    stop(process)
    raise ServerStartFailed(f"{what} did not answer {url}/health within {timeout_s:.0f}s{_tail(log)}")


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


def _tail(log: Path | None) -> str:
    if log is None or not log.exists():
        return ""
    return "; last log lines: " + " | ".join(log.read_text(errors="replace").strip().splitlines()[-5:])
