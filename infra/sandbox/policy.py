"""What a rollout's sandbox holds, and the bubblewrap command lines that build it: pure, no I/O.

A sandbox starts from an empty root. Into it go, in this order (a later
mount covers an earlier one at the same or a deeper path):

1. the system folders and the interpreter, read-only (`Layout`);
2. a new `/dev`, then `/tmp`, `/var/tmp`, `/dev/shm` and the agent's home,
   empty tmpfs of `limits.tmp_mb` each;
3. the policy's `read_only` paths (a harness's own runtime: its node_modules,
   its configuration, its script);
4. an empty, read-only tmpfs over each `hide` path: absent even under a
   visible folder;
5. the working copy and the `writable` folders: each a tmpfs of
   `limits.disk_mb` at its own path, filled with a copy of the real folder
   before the agent starts and copied back once every process of the agent is
   gone (`inside.py`). What the agent writes is bounded when it writes it, and
   the machine's disk never sees more than the copy back. The real folders are
   bound under `KEEP`, which the agent's own namespace covers.

So the precedence is: writable over hidden over read-only, and nothing that is
not named is there (not the home folder, not the tasks, not other rollouts'
copies, not the logs). `check` refuses a policy that would give the agent a
folder it must only read (a working copy holding the interpreter, say).
`visibility` evaluates a mount list the way the kernel does, for the property
tests that hold `plan` to these rules.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field

from infra.sandbox.errors import PolicyError

#: the machine's folders a program needs; a link among them (`/bin` → `usr/bin`) is made again as a link
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
#: the launcher's files in the sandbox: the gateway's relay, the script run there, the agent's user
RUN = "/run/tether"
SOCKET = f"{RUN}/gateway.sock"
INSIDE = f"{RUN}/inside.py"
#: the real working copy and writable folders, where the first stage copies them in and back (never the agent)
KEEP = f"{RUN}/keep"
HOME = "/home/agent"
SCRATCH = ("/tmp", "/var/tmp", "/dev/shm")
#: files of /etc made for the sandbox (its user's name; the gateway's host name on loopback)
ETC_FILES = ("/etc/hosts", "/etc/passwd", "/etc/group")
#: how many users a root launcher may hand out, one per sandbox running at once, from `Policy.uid`
UIDS = 4096


class Limits(BaseModel):
    """What one rollout may take of the machine. Memory, processes and CPU hold for the whole sandbox; the
    working copy and each writable folder hold at most `disk_mb` (their tmpfs also counts as memory)."""
    model_config = ConfigDict(extra="forbid", frozen=True)

    memory_mb: int = Field(8192, ge=64, description="Memory of every process in it together, its working copy's "
                                                    "tmpfs included (a cgroup).")
    processes: int = Field(512, ge=8, description="Processes and threads at once (RLIMIT_NPROC in its namespace, "
                                                  "and the cgroup's pids.max).")
    cpus: float | None = Field(None, gt=0, description="CPUs' worth of time (the cgroup's CPU quota); none: "
                                                       "unbounded.")
    disk_mb: int = Field(2048, ge=1, description="The working copy, and each writable folder: what it may hold, "
                                                 "and what is copied back of it (a sparse file's holes count).")
    files: int = Field(100_000, ge=10, description="The entries copied back of each (more: the copy stops).")
    cgroup: bool = Field(True, description="A cgroup is required (memory, processes and CPU bounded for the whole "
                                           "sandbox); false runs without one where none can be made, saying so.")
    file_mb: int = Field(512, ge=1, description="The largest file any process may write (RLIMIT_FSIZE), its "
                                                "output to the rollout's log included.")
    tmp_mb: int = Field(1024, ge=1, description="Each of /tmp, /var/tmp, /dev/shm and the home folder.")
    open_files: int = Field(4096, ge=64, description="Open files per process (RLIMIT_NOFILE).")


class Policy(BaseModel):
    """One rollout's sandbox, as the launcher (`python -m infra.sandbox`) reads it. Paths are absolute."""
    model_config = ConfigDict(extra="forbid", frozen=True)

    workdir: str = Field(description="The working copy: the agent's, read-write, its current directory.")
    read_only: list[str] = Field(default_factory=list)
    writable: list[str] = Field(default_factory=list, description="Made if missing; copied in and back as the "
                                                                  "working copy is.")
    hide: list[str] = Field(default_factory=list)
    gateway: str = Field(description="The gateway's URL as the harness is told it: the only address reachable.")
    uid: int = Field(2_100_000_000, ge=1000, le=2**31 - 1 - UIDS, description=(
        "When the launcher is root: the first of the users it hands out, one per sandbox running at once, none "
        "of them a user of this machine's."))
    limits: Limits = Field(default_factory=Limits)


@dataclass(frozen=True)
class Mount:
    """One step of the root's making, as bubblewrap takes it."""
    kind: Literal["ro", "rw", "tmpfs", "empty", "remount-ro", "symlink", "proc", "dev", "copy"]
    target: str
    source: str | None = None
    size_mb: int | None = None


@dataclass(frozen=True)
class Layout:
    """What the machine has that a plan needs, read by the launcher: the system folders as they are here
    (a link's target, or None for a folder), the interpreter's own folders, and the files made for /etc."""
    system: tuple[tuple[str, str | None], ...]
    interpreter: tuple[str, ...]
    etc: tuple[tuple[str, str], ...] = ()


#: an unprivileged user cannot listen below this port: a gateway there is served inside at its port + SHIFT
PRIVILEGED_PORTS, SHIFT = 1024, 10000


@dataclass(frozen=True)
class Gateway:
    """Where the relay listens inside (the URL's own host, and its port unless that is privileged), the port it
    reaches outside, and the host name, if any, that the sandbox's hosts file maps to loopback."""
    listen: tuple[str, ...]
    port: int
    name: str | None

    @property
    def inside_port(self) -> int:
        return self.port if self.port >= PRIVILEGED_PORTS else self.port + SHIFT


def inside_url(url: str) -> str:
    """The gateway's URL as a sandboxed harness must be told it: the same but for a privileged port."""
    gateway = gateway_of(url)
    if gateway.inside_port == gateway.port:
        return url
    parts = urlsplit(url)
    user, at, host = parts.netloc.rpartition("@")
    bare = host[:host.rindex(":")] if parts.port is not None else host
    return parts._replace(netloc=f"{user}{at}{bare}:{gateway.inside_port}").geturl()


def gateway_of(url: str) -> Gateway:
    """The addresses inside the sandbox that stand for the gateway. Its URL must name it by a host name or a
    loopback address: inside, only loopback exists, and a host name can be pointed at it."""
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise PolicyError(f"sandbox: the gateway URL {url!r}: {exc}") from exc
    host = parts.hostname
    if parts.scheme not in ("http", "https") or not host:
        raise PolicyError(f"sandbox: the gateway URL {url!r} is not an http(s) URL with a host")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        if host == "localhost":
            return Gateway(("127.0.0.1", "::1"), port, None)
        return Gateway(("127.0.0.1",), port, host)
    if not address.is_loopback:
        raise PolicyError(f"sandbox: the gateway URL {url!r} names it by an address the sandbox cannot have "
                          "(only loopback exists inside): name it by a host name, or put a relay on loopback")
    return Gateway((str(address),), port, None)


def _absolute(path: str, field: str) -> str:
    pure = PurePosixPath(path)
    if not pure.is_absolute() or ".." in pure.parts:
        raise PolicyError(f"sandbox.{field}: {path!r} is not an absolute path without '..'")
    return str(pure)


def _depth(path: str) -> int:
    return len(PurePosixPath(path).parts)


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _ancestors(path: str) -> list[str]:
    return [str(p) for p in reversed(PurePosixPath(path).parents) if str(p) != "/"]


def writable_of(policy: Policy) -> list[str]:
    """The working copy first, then the writable folders: what is copied in and back, in `KEEP/<index>`."""
    workdir = _absolute(policy.workdir, "workdir")
    return [workdir, *sorted({_absolute(p, "writable") for p in policy.writable} - {workdir})]


def check(policy: Policy, layout: Layout) -> None:
    """Refuse what would hand the agent more than its own: a writable folder holding (or inside) another, one
    holding a read-only or hidden path (the interpreter, the tasks), one that is a system folder or the root."""
    writable = writable_of(policy)
    guarded = [*layout.interpreter, *(_absolute(p, "read_only") for p in policy.read_only),
               *(_absolute(p, "hide") for p in policy.hide)]
    for i, folder in enumerate(writable):
        name = "workdir" if i == 0 else "writable"
        if folder == "/" or any(_within(folder, s) or _within(s, folder) for s, _ in layout.system):
            raise PolicyError(f"sandbox.{name} {folder}: the system's folders are read-only for the agent")
        if folder.startswith(RUN + "/") or folder == RUN:
            raise PolicyError(f"sandbox.{name} {folder}: {RUN} is the sandbox's own")
        for other in writable[i + 1:]:
            if _within(other, folder) or _within(folder, other):
                raise PolicyError(f"sandbox: {folder} and {other} are both writable and one holds the other")
        for path in guarded:
            if _within(path, folder):
                raise PolicyError(f"sandbox.{name} {folder} holds {path}, which the agent may only read or not "
                                  "see at all: give it a folder of its own")


def plan(policy: Policy, layout: Layout) -> list[Mount]:
    """The mounts, in order, that make the sandbox's root (see the module's docstring); `check`ed first."""
    check(policy, layout)
    read_only = sorted({_absolute(p, "read_only") for p in [*layout.interpreter, *policy.read_only]}, key=_depth)
    hide = sorted({_absolute(p, "hide") for p in policy.hide}, key=_depth)
    tmp = policy.limits.tmp_mb
    mounts: list[Mount] = []
    for path, link in layout.system:
        mounts.append(Mount("symlink", path, link) if link is not None else Mount("ro", path, path))
    system = {path for path, link in layout.system if link is None}
    mounts += [Mount("proc", "/proc"), Mount("dev", "/dev")]
    # the scratch folders before anything bound below them (a venv under /tmp stays the real one)
    mounts += [Mount("tmpfs", p, size_mb=tmp) for p in (*SCRATCH, HOME)]
    mounts += [Mount("ro", p, p) for p in read_only if not any(_within(p, s) for s in system)]
    mounts += [Mount("ro", target, source) for target, source in layout.etc]
    mounts += [Mount("empty", p) for p in hide]
    for i, folder in enumerate(writable_of(policy)):
        mounts += [Mount("rw", f"{KEEP}/{i}", folder), Mount("copy", folder, size_mb=policy.limits.disk_mb)]
    # last: a hidden folder's tmpfs is made read-only once the folders bound below it have their mount points
    mounts += [Mount("remount-ro", p) for p in hide]
    return mounts


def root_argv(mounts: list[Mount], *, socket: str, inside: str, privileged: bool) -> list[str]:
    """The first bubblewrap's arguments (passed with `--args`): the sandbox's filesystem, made by the launcher's
    own user (so that what it may read, a root's interpreter in /root included, can be bound), in a mount,
    process, network, IPC and host-name namespace of its own. Every folder it makes on the way to a mount is
    0755 (bubblewrap's own would be the launcher's only). Privileged (root), it keeps only the capabilities to
    change user, which its command uses at once."""
    argv = ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--die-with-parent"]
    argv += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"] if privileged else \
        ["--unshare-user"]
    for m in [*mounts, Mount("ro", SOCKET, socket), Mount("ro", INSIDE, inside)]:
        if m.kind in ("ro", "rw", "empty", "tmpfs", "copy"):
            for folder in _ancestors(m.target):
                argv += ["--perms", "0755", "--dir", folder]
        if m.kind == "symlink":
            argv += ["--symlink", str(m.source), m.target]
        elif m.kind == "proc":
            argv += ["--proc", m.target]
        elif m.kind == "dev":
            argv += ["--dev", m.target]
        elif m.kind == "tmpfs":
            argv += ["--size", str((m.size_mb or 1) * 1024 * 1024), "--perms", "1777", "--tmpfs", m.target]
        elif m.kind == "copy":
            argv += ["--size", str((m.size_mb or 1) * 1024 * 1024), "--perms", "0777", "--tmpfs", m.target]
        elif m.kind == "empty":
            argv += ["--size", str(64 * 1024), "--perms", "0555", "--tmpfs", m.target]
        elif m.kind == "remount-ro":
            argv += ["--remount-ro", m.target]
        else:
            argv += ["--ro-bind" if m.kind == "ro" else "--bind", str(m.source), m.target]
    return argv


def jail_argv(bwrap: str, *, workdir: str, uid: int, gid: int, new_session: bool) -> list[str]:
    """The second bubblewrap, run by the first stage as the sandbox's user: the first one's root as it is (its
    mounts locked as they are: what is read-only stays so) but for `KEEP`, covered; a user, process, network,
    IPC, host-name and cgroup namespace of its own, where no process can make a user namespace. Its /proc is
    the first stage's (a new one cannot be mounted over one whose folders bubblewrap has covered), which holds
    this sandbox's processes only. `new_session` where a terminal is at hand: no input can be pushed into it."""
    return [bwrap, "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", "--disable-userns", "--die-with-parent", "--uid", str(uid), "--gid", str(gid),
            "--hostname", "tether-sandbox", "--cap-drop", "ALL", *(["--new-session"] if new_session else []),
            "--bind", "/", "/", "--dev-bind", "/dev", "/dev", "--size", "4096", "--perms", "0555", "--tmpfs", KEEP,
            "--remount-ro", KEEP, "--chdir", workdir]


def visibility(mounts: list[Mount], path: str) -> Literal["absent", "read-only", "writable", "empty"]:
    """What the agent finds at `path`, from the mounts as the kernel stacks them: the last mount at or above the
    path decides. `empty`: a tmpfs made there, nothing of the machine's under it. `KEEP` is covered for it."""
    if _within(path, KEEP):
        return "empty"
    found: Literal["absent", "read-only", "writable", "empty"] = "absent"
    for m in mounts:
        if m.kind != "remount-ro" and _within(path, m.target):
            found = KIND_SEEN[m.kind]
    return found


KIND_SEEN: dict[str, Literal["absent", "read-only", "writable", "empty"]] = {
    "ro": "read-only", "rw": "writable", "symlink": "read-only", "proc": "read-only", "dev": "read-only",
    "tmpfs": "empty", "empty": "empty", "copy": "writable"}
