"""What the machine says when a test fails, attached to the failure's report.

A process that vanishes mid-test (a Ray worker, a broker) leaves only "it died" in the test's own output; whether
the kernel's OOM killer took it, it crashed, or something signalled it is in the kernel log, the memory cgroup
and Ray's own log files, which are gone by the time anyone reads a CI run. Read them at the failure instead."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Generator
from pathlib import Path

import pytest

_KERNEL = re.compile(r"out of memory|oom[-_ ]kill|killed process|segfault|traps:|general protection", re.I)
_FATAL = re.compile(r"fatal python error|segmentation fault|sigsegv|sigabrt|sigbus|aborted|terminate called|"
                    r"out of memory|oom", re.I)
_RAYLET = re.compile(r"^\[20.*(graceful=false|sending sig|killed|out of memory|oom|died|exit code [1-9]|exited)", re.I)
_RAY_SESSIONS = Path("/tmp/ray")
_STARTED = time.time()  # Ray's logs written since this test session began, not an earlier run's


def _tail(lines: list[str], n: int = 8) -> list[str]:
    return [line[:300] for line in lines[-n:]]


def _memory() -> list[str]:
    try:
        info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    except (OSError, ValueError):
        return []
    return [f"memory: {info.get('MemAvailable', '?').strip()} available of {info.get('MemTotal', '?').strip()}"]


def _cgroup_oom_kills() -> list[str]:
    """The memory cgroup's own count of OOM kills (cgroup v2 memory.events, or v1 memory.oom_control)."""
    try:
        entries = [line.split(":", 2) for line in Path("/proc/self/cgroup").read_text().splitlines()]
    except OSError:
        return []
    found = []
    for _, controllers, path in entries:
        base = Path("/sys/fs/cgroup") / path.lstrip("/") if controllers == "" else (
            Path("/sys/fs/cgroup/memory") / path.lstrip("/") if "memory" in controllers.split(",") else None)
        for name in ("memory.events", "memory.oom_control"):
            counts = base / name if base else None
            if counts is not None and counts.is_file():
                kills = [line for line in counts.read_text().splitlines() if line.startswith("oom_kill ")]
                found += [f"{counts}: {line}" for line in kills]
    return found


def _kernel_log() -> list[str]:
    try:
        out = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return ["kernel log: dmesg could not run"]
    return _tail([f"kernel: {line}" for line in out.splitlines() if _KERNEL.search(line)])


def _ray_logs() -> list[str]:
    """From the newest Ray session (its `session_latest` link is not always moved on)."""
    sessions = sorted(_RAY_SESSIONS.glob("session_2*/logs"), key=lambda p: p.stat().st_mtime)
    if not sessions:
        return []
    found = []
    for log in [*sorted(sessions[-1].glob("worker-*.err")), sessions[-1] / "raylet.out"]:
        try:
            if log.stat().st_mtime < _STARTED:
                continue
            lines = log.read_text(errors="replace").splitlines()
        except OSError:
            continue
        pattern = _RAYLET if log.name == "raylet.out" else _FATAL
        found += _tail([f"{log.name}: {line}" for line in lines if pattern.search(line)])
    return found


def _largest_processes() -> list[str]:
    try:
        out = subprocess.run(["ps", "-eo", "pid,rss,etime,args", "--sort=-rss"], capture_output=True, text=True,
                             timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line[:200] for line in out.splitlines()[:8]]


def machine_report() -> str:
    return "\n".join([*_memory(), *_cgroup_oom_kills(), *_kernel_log(), *_ray_logs(), *_largest_processes()])


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed and call.when in ("setup", "call"):
        report.sections.append(("machine at failure", machine_report()))
    return report
