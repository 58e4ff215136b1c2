"""A cgroup per sandbox that bounds the memory (swap included) and the processes of everything in it.

cgroup v2 where this process's cgroup delegates the memory and pids
controllers to children (a systemd unit with `Delegate=yes`, a container with
its own cgroup namespace), else cgroup v1's memory and pids hierarchies where
this process may make groups in them (root on a machine that mounts them).
Where neither works the sandbox still runs, with the process count bounded by
its rlimit and memory not bounded: `make` says why, and the launcher writes
it in the rollout's log.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

V2_ROOT = Path("/sys/fs/cgroup")
V1_ROOTS = {"memory": Path("/sys/fs/cgroup/memory"), "pids": Path("/sys/fs/cgroup/pids"),
            "cpu": Path("/sys/fs/cgroup/cpu")}
PERIOD_US = 100_000


@dataclass(frozen=True)
class Cgroup:
    """The groups the sandbox joins (one in v2, one per controller in v1)."""
    folders: tuple[Path, ...]

    def join(self) -> None:
        """Move the calling process in: its children are born inside."""
        for folder in self.folders:
            (folder / "cgroup.procs").write_text(str(os.getpid()))

    def oom_kills(self) -> int:
        """How many processes the memory limit killed (0 where the kernel does not say)."""
        for folder in self.folders:
            for name, key in (("memory.events", "oom_kill"), ("memory.oom_control", "oom_kill")):
                with contextlib.suppress(OSError, ValueError):
                    for line in (folder / name).read_text().splitlines():
                        field, _, value = line.partition(" ")
                        if field == key:
                            return int(value)
        return 0

    def remove(self, wait_s: float = 5.0) -> None:
        """Remove the groups once their processes are gone (the kernel frees a group's last ones lazily)."""
        deadline = time.monotonic() + wait_s
        for folder in self.folders:
            while True:
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.05)


def _own_groups() -> dict[str, str]:
    """This process's cgroup per hierarchy: '' for v2, else each controller's name."""
    found: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for name in controllers.split(",") if controllers else [""]:
                found[name] = path
    return found


def _write(folder: Path, name: str, value: str) -> bool:
    try:
        (folder / name).write_text(value)
        return True
    except OSError:
        return False


def _v2(name: str, memory: int, processes: int, cpus: float | None) -> Cgroup | None:
    own = _own_groups().get("")
    if own is None or not (V2_ROOT / "cgroup.controllers").exists():
        return None
    parent = V2_ROOT / own.lstrip("/")
    try:
        enabled = (parent / "cgroup.subtree_control").read_text().split()
    except OSError:
        return None
    if not {"memory", "pids", *(["cpu"] if cpus else [])} <= set(enabled):
        return None
    folder = parent / name
    try:
        folder.mkdir()
    except OSError:
        return None
    settings = [("memory.max", str(memory)), ("memory.swap.max", "0"), ("pids.max", str(processes))]
    if cpus:
        settings.append(("cpu.max", f"{int(cpus * PERIOD_US)} {PERIOD_US}"))
    if all(_write(folder, k, v) for k, v in settings):
        return Cgroup((folder,))
    Cgroup((folder,)).remove(0)
    return None


def _v1(name: str, memory: int, processes: int, cpus: float | None) -> Cgroup | None:
    own = _own_groups()
    made: list[Path] = []
    # swap accounting is optional in v1 (the memsw file exists only with it): where it exists it is bounded too
    wanted = {"memory": [("memory.limit_in_bytes", str(memory)), ("memory.memsw.limit_in_bytes", str(memory))],
              "pids": [("pids.max", str(processes))]}
    if cpus:
        wanted["cpu"] = [("cpu.cfs_period_us", str(PERIOD_US)), ("cpu.cfs_quota_us", str(int(cpus * PERIOD_US)))]
    for controller, settings in wanted.items():
        root = V1_ROOTS[controller]
        if controller not in own or not (root / "cgroup.procs").exists():
            break
        folder = root / own[controller].lstrip("/") / name
        try:
            folder.mkdir()
        except OSError:
            break
        made.append(folder)
        optional = "memory.memsw.limit_in_bytes"
        if not all(_write(folder, k, v) for k, v in settings if k != optional or (folder / k).exists()):
            break
    else:
        return Cgroup(tuple(made))
    Cgroup(tuple(made)).remove(0)
    return None


def sweep() -> None:
    """Empty groups that killed launchers left (`tether-*-PID` beside this process's own, PID gone): the kernel
    removes a group only when it is empty, so one still in use stays."""
    own = _own_groups()
    parents = [V2_ROOT / own[""].lstrip("/")] if "" in own and (V2_ROOT / "cgroup.controllers").exists() else []
    parents += [root / own[c].lstrip("/") for c, root in V1_ROOTS.items() if c in own]
    for parent in parents:
        with contextlib.suppress(OSError):
            for folder in parent.glob("tether-*"):
                with contextlib.suppress(OSError):
                    pid = folder.name.rsplit("-", 1)[-1]
                    if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                        folder.rmdir()


def make(name: str, memory_mb: int, processes: int, cpus: float | None = None) -> tuple[Cgroup | None, str]:
    """A new group `name` with the limits, and how it was made (or why none could be)."""
    memory = memory_mb * 1024 * 1024
    found = _v2(name, memory, processes, cpus)
    if found is not None:
        return found, "cgroup v2"
    found = _v1(name, memory, processes, cpus)
    if found is not None:
        return found, "cgroup v1"
    return None, ("no cgroup could be made here (cgroup v2 without the memory and pids controllers delegated, "
                  "and no writable v1 hierarchies): memory and CPU are not bounded, processes only by their rlimit")
