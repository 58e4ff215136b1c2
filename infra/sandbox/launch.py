"""The launcher: one process per sandboxed rollout, outside the sandbox, that makes it, relays it to the gateway,
watches its disk and cleans up after it.

`python -m infra.sandbox POLICY -- COMMAND...` (POLICY is `Policy` as JSON),
run by the controller's local runner in the rollout's process group, so a
controller that restarts finds the rollout as before. In order:

1. the working copy and the writable folders are given to the sandbox's user
   (when the launcher is root: an unprivileged user, `nobody` by default);
2. the gateway's relay listens on a Unix socket in a private folder: each
   connection from inside is passed to the gateway's host and port, nothing
   else can be asked of it;
3. bubblewrap makes the sandbox (`policy.plan`), in a cgroup of its own where
   one can be made (`cgroups`), as that user, and runs `inside.py` there,
   which sets the limits, serves the relay on the gateway's address and runs
   the command;
4. while it runs, the written size and the number of entries of the working
   copy and the writable folders are read every second or so: past
   `limits.disk_mb` or `limits.files` the sandbox is killed, saying why;
5. its exit code is this process's (125: the sandbox could not be made, said on
   stderr, which is the rollout's log).

SIGTERM and SIGINT reach the harness directly (it is in the same process group);
the launcher outlives it to clean up. SIGKILL to the group kills bubblewrap,
and with it (`--die-with-parent`, its process namespace) everything inside.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from infra.sandbox import cgroups
from infra.sandbox import policy as policy_module
from infra.sandbox.errors import PolicyError, SandboxError, SandboxUnavailable
from infra.sandbox.policy import (
    HOME,
    SOCKET,
    SYSTEM,
    Gateway,
    Layout,
    Policy,
    drop_argv,
    gateway_of,
    jail_argv,
    plan,
    root_argv,
)

INSIDE = Path(__file__).with_name("inside.py")
NOBODY = 65534
#: the launcher's own exit status when it could not make the sandbox (as `env` and `timeout` use it)
CANNOT_SANDBOX = 125
KILLED = 137
CHUNK = 65536


def say(message: str) -> None:
    print(f"tether sandbox: {message}", file=sys.stderr, flush=True)


def layout() -> Layout:
    system = tuple((p, os.readlink(p) if os.path.islink(p) else None) for p in SYSTEM if os.path.lexists(p))
    interpreter = {sys.prefix, sys.base_prefix, sys.exec_prefix, str(Path(sys.executable).parent.parent)}
    return Layout(system, tuple(sorted(os.path.realpath(p) for p in interpreter)))


def identity(policy: Policy) -> tuple[int, int]:
    """Who the sandbox runs as: the policy's user (nobody by default) when the launcher is root, else the
    launcher's own user (which is unprivileged already)."""
    if os.geteuid() == 0:
        uid = policy.uid or NOBODY
        return uid, policy.gid or uid
    if policy.uid not in (None, os.geteuid()):
        raise PolicyError(f"sandbox.uid {policy.uid}: only root may run the sandbox as another user")
    return os.geteuid(), os.getegid()


def give(folder: Path, uid: int, gid: int) -> None:
    """`folder` and everything in it owned by the sandbox's user (links themselves, never what they name)."""
    for parent, folders, files in os.walk(folder):
        for name in [*folders, *files]:
            os.chown(os.path.join(parent, name), uid, gid, follow_symlinks=False)
    os.chown(folder, uid, gid, follow_symlinks=False)


def prepare(policy: Policy, uid: int, gid: int) -> Policy:
    """The working copy checked and the writable folders made, all the sandbox user's; every path real."""
    workdir = Path(os.path.realpath(policy.workdir))
    if not workdir.is_dir():
        raise PolicyError(f"sandbox.workdir {policy.workdir}: not a folder (its set-up makes it)")
    writable = []
    for path in policy.writable:
        Path(path).mkdir(parents=True, exist_ok=True)
        real = Path(os.path.realpath(path))
        if not real.is_dir():
            raise PolicyError(f"sandbox.writable {path}: not a folder")
        writable.append(real)
    if os.geteuid() == 0:
        for folder in (workdir, *writable):
            give(folder, uid, gid)
    seen = [os.path.realpath(p) for p in policy.read_only]
    return policy.model_copy(update={"workdir": str(workdir), "writable": [str(p) for p in writable],
                                     "read_only": [p for p in seen if os.path.exists(p)],
                                     "hide": [os.path.realpath(p) for p in policy.hide]})


@dataclass
class Usage:
    """What the writable folders hold: bytes on disk and entries."""
    bytes: int = 0
    entries: int = 0


def usage(folders: list[str]) -> Usage:
    found = Usage()
    pending = list(folders)
    while pending:
        try:
            with os.scandir(pending.pop()) as entries:
                for entry in entries:
                    found.entries += 1
                    with contextlib.suppress(OSError):
                        info = entry.stat(follow_symlinks=False)
                        found.bytes += info.st_blocks * 512
                        if entry.is_dir(follow_symlinks=False):
                            pending.append(entry.path)
        except OSError:
            continue
    return found


class Relay:
    """The gateway's only way in: a Unix socket whose every connection goes to the gateway's host and port."""

    def __init__(self, folder: Path, upstream: tuple[str, int]) -> None:
        self.path = folder / "gateway.sock"
        self.upstream = upstream
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(self.path))
        os.chmod(self.path, 0o666)  # the sandbox's user connects; the folder is the launcher's
        self.listener.listen(128)

    async def serve(self) -> asyncio.Server:
        return await asyncio.start_unix_server(self._one, sock=self.listener)

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pump(reader, up_writer), _pump(up_reader, writer), return_exceptions=True)


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(CHUNK):
            writer.write(chunk)
            await writer.drain()
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            if writer.can_write_eof():
                writer.write_eof()
            else:
                writer.close()


def hosts_file(folder: Path, gateway: Gateway) -> str | None:
    """The sandbox's /etc/hosts when the gateway has a host name: the machine's, with that name on loopback."""
    if gateway.name is None:
        return None
    path = folder / "hosts"
    with contextlib.suppress(OSError):
        shutil.copyfile("/etc/hosts", path)
    with path.open("a") as hosts:
        hosts.write(f"\n127.0.0.1 {gateway.name}\n")
    path.chmod(0o644)
    return str(path)


def inside_spec(policy: Policy, gateway: Gateway) -> str:
    limits = policy.limits
    rlimits = {"RLIMIT_NPROC": limits.processes, "RLIMIT_FSIZE": limits.file_mb * 1024 * 1024,
               "RLIMIT_NOFILE": limits.open_files, "RLIMIT_CORE": 0}
    return json.dumps({"rlimits": rlimits, "listen": list(gateway.listen), "port": gateway.port, "socket": SOCKET})


def environment() -> dict[str, str]:
    """The harness's environment as the runner gave it, with a home and scratch of the sandbox's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "DBUS_", "SSH_AUTH", "KRB5"))}
    env.update(HOME=HOME, TMPDIR="/tmp", USER="agent", LOGNAME="agent")
    return env


def _rollout_name() -> str:
    rollout = re.sub(r"[^A-Za-z0-9._-]", "_", os.environ.get("TETHER_ROLLOUT_ID", "sandbox"))[:100]
    return f"tether-{rollout}-{os.getpid()}"


async def _watch(process: subprocess.Popen[bytes], policy: Policy) -> str | None:
    """Until the sandbox ends: its writable folders' growth, and why it was killed, if it was."""
    folders = [policy.workdir, *policy.writable]
    start = usage(folders)
    limits = policy.limits
    interval = 1.0
    while process.poll() is None:
        await asyncio.sleep(interval)
        began = time.monotonic()
        now = usage(folders)
        interval = max(1.0, 5 * (time.monotonic() - began))  # a large tree is read less often
        grown = (now.bytes - start.bytes) / 1024 / 1024
        if grown > limits.disk_mb or now.entries - start.entries > limits.files:
            with contextlib.suppress(ProcessLookupError):
                process.kill()  # bubblewrap: with it goes everything inside
            return (f"the working copy and writable folders grew by {grown:.0f} MB and "
                    f"{now.entries - start.entries} entries, past the limits ({limits.disk_mb} MB, "
                    f"{limits.files} entries): the sandbox was killed")
    return None


async def _supervise(process: subprocess.Popen[bytes], relay: Relay, policy: Policy) -> tuple[int, str | None]:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, lambda: None)  # the harness has it too; this process stays to clean up
    server = await relay.serve()
    watcher = asyncio.create_task(_watch(process, policy))
    code = await loop.run_in_executor(None, process.wait)
    server.close()
    watcher.cancel()  # a watcher that killed the sandbox is done already, with its reason
    try:
        reason = await watcher
    except asyncio.CancelledError:
        reason = None
    return code, reason


def run(policy: Policy, command: list[str]) -> int:
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable("bubblewrap is not installed (Debian: apt-get install bubblewrap)")
    uid, gid = identity(policy)
    policy = prepare(policy, uid, gid)
    gateway = gateway_of(policy.gateway)
    upstream_host = gateway.name or gateway.listen[0]
    folder = Path(tempfile.mkdtemp(prefix="tether-sandbox-"))
    group: cgroups.Cgroup | None = None
    try:
        folder.chmod(0o755)  # bubblewrap, as the sandbox's user, binds the socket from here
        relay = Relay(folder, (upstream_host, gateway.port))
        mounts = plan(policy, layout(), hosts=hosts_file(folder, gateway))
        root = os.geteuid() == 0
        argv = [*root_argv(bwrap, mounts, socket=str(relay.path), inside=str(INSIDE), privileged=root), "--",
                *(drop_argv(uid, gid) if root else []), *jail_argv(bwrap, workdir=policy.workdir, uid=uid, gid=gid),
                "--", sys.executable, "-I", "-S", policy_module.INSIDE, inside_spec(policy, gateway), "--", *command]
        group, how = cgroups.make(_rollout_name(), policy.limits.memory_mb, policy.limits.processes)
        if group is None:
            say(how)

        def enter() -> None:  # in the child, before bubblewrap: no thread exists yet in this process
            if group is not None:
                group.join()

        process = subprocess.Popen(argv, env=environment(), preexec_fn=enter)
        code, reason = asyncio.run(_supervise(process, relay, policy))
        if reason is not None:
            say(reason)
            return KILLED
        if group is not None and group.oom_kills():
            say(f"the memory limit ({policy.limits.memory_mb} MB) killed {group.oom_kills()} process(es)")
        return code if code >= 0 else 128 - code
    finally:
        if group is not None:
            group.remove()
        shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str]) -> int:
    if "--" not in argv[1:] or len(argv) < 4:
        say("usage: python -m infra.sandbox POLICY -- COMMAND...")
        return CANNOT_SANDBOX
    try:
        policy = Policy.model_validate_json(argv[1])
        return run(policy, argv[argv.index("--") + 1:])
    except ValidationError as exc:
        say(f"the policy is not valid: {exc}")
    except SandboxError as exc:
        say(str(exc))
    except OSError as exc:
        say(f"the sandbox could not be made: {exc}")
    return CANNOT_SANDBOX
