"""What a rollout's sandbox holds, and the bubblewrap command line that builds it: pure, no I/O.

A sandbox starts from an empty root. Into it go, in this order (a later
mount covers an earlier one at the same or a deeper path):

1. the system folders and the interpreter, read-only (`Layout.system`);
2. the policy's `read_only` paths (a harness's own runtime: its node_modules,
   its configuration);
3. an empty tmpfs over each `hide` path: absent even under a visible folder;
4. `/tmp`, `/var/tmp`, `/dev/shm` and the agent's home, empty tmpfs of
   `limits.tmp_mb` each, a new `/proc` and a minimal `/dev`;
5. the `writable` folders and, last, the working copy, read-write: the agent's
   own, whatever covers their parents.

So the precedence is: writable over hidden over read-only, and nothing that is
not named is there (not the home folder, not the tasks, not other rollouts'
copies, not the logs). `visibility` evaluates a mount list the way the kernel
does, for the property tests that hold `plan` to these rules.
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
#: where the agent finds the gateway's relay, and its own home
SOCKET = "/run/tether/gateway.sock"
INSIDE = "/run/tether/inside.py"
HOME = "/home/agent"
SCRATCH = ("/tmp", "/var/tmp", "/dev/shm")
#: the sandbox's hosts file, when the gateway is named by a host name (bound over /etc/hosts)
HOSTS = "/etc/hosts"


class Limits(BaseModel):
    """What one rollout may take of the machine. Processes and memory hold for the whole sandbox; disk for the
    working copy and the writable folders together (each scratch folder has its own `tmp_mb`)."""
    model_config = ConfigDict(extra="forbid", frozen=True)

    memory_mb: int = Field(4096, ge=64, description="Memory of every process in the sandbox together (a cgroup).")
    processes: int = Field(512, ge=8, description="Processes and threads at once (RLIMIT_NPROC in its namespace).")
    disk_mb: int = Field(4096, ge=1, description="The working copy and writable folders: bytes written.")
    files: int = Field(200_000, ge=100, description="The working copy and writable folders: entries.")
    file_mb: int = Field(1024, ge=1, description="The largest file any process may write (RLIMIT_FSIZE).")
    tmp_mb: int = Field(1024, ge=1, description="Each of /tmp, /var/tmp, /dev/shm and the home folder.")
    open_files: int = Field(4096, ge=64, description="Open files per process (RLIMIT_NOFILE).")


class Policy(BaseModel):
    """One rollout's sandbox, as the launcher (`python -m infra.sandbox`) reads it. Paths are absolute."""
    model_config = ConfigDict(extra="forbid", frozen=True)

    workdir: str = Field(description="The working copy: the agent's, read-write, its current directory.")
    read_only: list[str] = Field(default_factory=list)
    writable: list[str] = Field(default_factory=list, description="Made if missing, owned by the sandbox's user.")
    hide: list[str] = Field(default_factory=list)
    gateway: str = Field(description="The gateway's URL as the harness is told it: the only address reachable.")
    uid: int | None = Field(None, ge=1, description="The unprivileged user it runs as when the launcher is root.")
    gid: int | None = Field(None, ge=1)
    limits: Limits = Field(default_factory=Limits)


@dataclass(frozen=True)
class Mount:
    """One step of the root's making, as bubblewrap takes it."""
    kind: Literal["ro", "rw", "tmpfs", "empty", "remount-ro", "symlink", "proc", "dev"]
    target: str
    source: str | None = None
    size_mb: int | None = None


@dataclass(frozen=True)
class Layout:
    """What the machine has that a plan needs, read by the launcher: the system folders as they are here
    (a link's target, or None for a folder), and the interpreter's own folders."""
    system: tuple[tuple[str, str | None], ...]
    interpreter: tuple[str, ...]


@dataclass(frozen=True)
class Gateway:
    """Where the relay listens inside (the URL's own host and port), and the host name, if any, that the
    sandbox's hosts file maps to loopback."""
    listen: tuple[str, ...]
    port: int
    name: str | None


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


def _ancestors(path: str) -> list[str]:
    parts = PurePosixPath(path).parents
    return [str(p) for p in reversed(parts) if str(p) != "/"]


def plan(policy: Policy, layout: Layout, *, hosts: str | None = None) -> list[Mount]:
    """The mounts, in order, that make the sandbox's root (see the module's docstring). `hosts`: the path of the
    hosts file to bind over /etc/hosts, when the gateway has a host name."""
    workdir = _absolute(policy.workdir, "workdir")
    read_only = sorted({_absolute(p, "read_only") for p in [*layout.interpreter, *policy.read_only]}, key=_depth)
    hide = sorted({_absolute(p, "hide") for p in policy.hide}, key=_depth)
    writable = sorted({_absolute(p, "writable") for p in policy.writable} - {workdir}, key=_depth)
    tmp = policy.limits.tmp_mb
    mounts: list[Mount] = []
    for path, link in layout.system:
        mounts.append(Mount("symlink", path, link) if link is not None else Mount("ro", path, path))
    system = {path for path, link in layout.system if link is None}
    mounts += [Mount("proc", "/proc"), Mount("dev", "/dev")]
    # the scratch folders before anything bound below them (a working copy in /tmp stays the real one)
    mounts += [Mount("tmpfs", p, size_mb=tmp) for p in (*SCRATCH, HOME)]
    mounts += [Mount("ro", p, p) for p in read_only
               if not any(p == s or p.startswith(s + "/") for s in system)]  # already there, read-only
    if hosts is not None:
        mounts.append(Mount("ro", HOSTS, hosts))
    mounts += [Mount("empty", p) for p in hide]
    mounts += [Mount("rw", p, p) for p in writable]
    mounts.append(Mount("rw", workdir, workdir))
    # last: a hidden folder's tmpfs is made read-only once the folders bound below it have their mount points
    mounts += [Mount("remount-ro", p) for p in hide]
    return mounts


def root_argv(bwrap: str, mounts: list[Mount], *, socket: str, inside: str, privileged: bool) -> list[str]:
    """The first bubblewrap: the sandbox's filesystem, made by the launcher's own user (so that what it may read,
    a root's interpreter in /root included, can be bound), in a mount and process namespace of its own. Every
    folder it makes on the way to a mount is 0755 (bubblewrap's own are the launcher's only). Privileged (root),
    it keeps only the capabilities to change user: its command drops to the sandbox's user at once."""
    argv = [bwrap, "--unshare-pid", "--die-with-parent"]
    argv += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"] if privileged else \
        ["--unshare-user"]
    for m in [*mounts, Mount("ro", SOCKET, socket), Mount("ro", INSIDE, inside)]:
        if m.kind in ("ro", "rw", "empty", "tmpfs"):
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
        elif m.kind == "empty":
            argv += ["--size", str(64 * 1024), "--perms", "0555", "--tmpfs", m.target]
        elif m.kind == "remount-ro":
            argv += ["--remount-ro", m.target]
        else:
            argv += ["--ro-bind" if m.kind == "ro" else "--bind", str(m.source), m.target]
    return argv


def drop_argv(uid: int, gid: int) -> list[str]:
    """Between the two bubblewraps, when the first is root's: to the sandbox's user, for good (no supplementary
    groups, and nothing it runs can gain privileges: no set-user-id program counts)."""
    return ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--no-new-privs", "--"]


def jail_argv(bwrap: str, *, workdir: str, uid: int, gid: int) -> list[str]:
    """The second bubblewrap, as the sandbox's user: the first one's root as it is (its mounts locked as they
    are: what is read-only stays so), in a user, network, IPC, host-name and cgroup namespace of its own: its
    network is loopback alone, and no process in it can make a user namespace. The process namespace and /proc
    are the first one's (a new /proc cannot be mounted over one whose folders bubblewrap has covered): it holds
    this sandbox's processes only."""
    return [bwrap, "--unshare-user", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--disable-userns", "--die-with-parent", "--uid", str(uid), "--gid", str(gid),
            "--hostname", "tether-sandbox", "--cap-drop", "ALL", "--bind", "/", "/", "--dev-bind", "/dev", "/dev",
            "--chdir", workdir]


def visibility(mounts: list[Mount], path: str) -> Literal["absent", "read-only", "writable", "empty"]:
    """What a process in the sandbox finds at `path`, from the mounts as the kernel stacks them: the last mount
    at or above the path decides. `empty`: a tmpfs made there, nothing of the machine's under it."""
    found: Literal["absent", "read-only", "writable", "empty"] = "absent"
    for m in mounts:
        if m.kind != "remount-ro" and (path == m.target or path.startswith(m.target.rstrip("/") + "/")):
            found = KIND_SEEN[m.kind]
    return found


KIND_SEEN: dict[str, Literal["absent", "read-only", "writable", "empty"]] = {
    "ro": "read-only", "rw": "writable", "symlink": "read-only", "proc": "read-only", "dev": "read-only",
    "tmpfs": "empty", "empty": "empty"}
