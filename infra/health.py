"""A container's health check, with the standard library only: a check runs every few seconds and must start fast.

A service with an HTTP port answers its `/health` (the gateway, the engine);
the broker takes a connection on its port; one without a port (the
processors, the controller, the trainer) beats: its event
loop rewrites a small file every few seconds (`beating`), and the check
fails once the file is older than a bound (the loop is stuck or gone).

    python -m infra.health --url http://127.0.0.1:8000/health
    python -m infra.health --tcp 127.0.0.1:9092
    python -m infra.health --beat .tether/health/processors [--max-age-s 30]

The images run it (infra/images/Containerfile); the beat files live under the
working directory, `.tether/health/<role>`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

BEAT_EVERY_S = 5.0
MAX_AGE_S = 30.0  # six beats missed


def beat_file(role: str) -> Path:
    """Where `role` beats, relative to its working directory (the images' /var/lib/tether)."""
    return Path(".tether") / "health" / role


def beat(path: Path) -> None:
    """Write now's time to `path`, whole (a check never reads half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_text(f"{time.time():.3f}\n")
    os.replace(partial, path)


async def beating(path: Path, every_s: float = BEAT_EVERY_S) -> None:
    """Beat until cancelled; a beat that cannot be written (a read-only disk) is tried again, never fatal."""
    while True:
        with contextlib.suppress(OSError):
            await asyncio.to_thread(beat, path)
        await asyncio.sleep(every_s)


async def beating_while(role: str, work: Awaitable[T]) -> T:
    """`work`'s result, `role` beating meanwhile (`tether controller run` and `tether trainer run`)."""
    task = asyncio.create_task(beating(beat_file(role)))
    try:
        return await work
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def check_beat(path: Path, max_age_s: float = MAX_AGE_S, now: float | None = None) -> str | None:
    """None when `path` was beaten within `max_age_s`; else why not."""
    try:
        written = float(path.read_text())
    except FileNotFoundError:
        return f"{path} does not exist: the service has not beaten yet"
    except (OSError, ValueError) as exc:
        return f"{path} cannot be read: {exc}"
    age = (time.time() if now is None else now) - written
    return None if age <= max_age_s else f"{path} last beaten {age:.0f} s ago (bound {max_age_s:.0f} s)"


def check_url(url: str, timeout_s: float = 4.0) -> str | None:
    """None when `url` answers 200; else why not."""
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through HTTP(S)_PROXY
    try:
        with direct.open(url, timeout=timeout_s) as response:
            return None if response.status == 200 else f"{url} answered {response.status}"
    except (urllib.error.URLError, OSError) as exc:
        return f"{url} did not answer: {exc}"


def check_tcp(address: str, timeout_s: float = 4.0) -> str | None:
    """None when `address` (host:port) takes a connection; else why not."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return None
    except (OSError, ValueError) as exc:
        return f"{address} took no connection: {exc}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--url", help="healthy when it answers 200")
    which.add_argument("--tcp", help="healthy when this host:port takes a connection")
    which.add_argument("--beat", type=Path, help="healthy when this file was beaten recently")
    parser.add_argument("--max-age-s", type=float, default=MAX_AGE_S)
    args = parser.parse_args(argv)
    problem = (check_url(args.url) if args.url else check_tcp(args.tcp) if args.tcp else
               check_beat(args.beat, args.max_age_s))
    if problem is not None:
        print(f"unhealthy: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
