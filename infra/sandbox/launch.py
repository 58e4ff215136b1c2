"""The launcher: one process per sandboxed rollout, outside the sandbox, that makes it, relays it to the gateway
and cleans up after it.

`python -m infra.sandbox POLICY -- COMMAND...` (POLICY is `Policy` as JSON),
run by the controller's local runner in the rollout's process group, so a
controller that restarts finds the rollout as before. In order:

1. the policy is checked (`policy.check`) before anything is touched;
2. a user of its own for the sandbox: root hands out one per sandbox running
   at once (`Policy.uid` on, each held by a lock while its sandbox runs, none
   of them the machine's); otherwise the launcher's own user;
3. the working copy and the writable folders become that user's (a file with
   other hard links is copied first, so that nothing outside them changes
   owner);
4. the gateway's relay listens on a Unix socket in a private folder: each
   connection from inside is passed to the gateway's host and port, at most
   `MAX_CONNECTIONS` at once, and nothing else can be asked of it;
5. bubblewrap makes the sandbox (`policy`, its arguments read from a file so
   that no process lists them), in a cgroup of its own where one can be made
   (`cgroups`) and a session keyring of its own, and runs `inside.py`, which
   copies the folders in, runs the agent and copies them back;
6. its exit code is this process's (125: the sandbox could not be made or its
   work not copied back, said on stderr, which is the rollout's log).

SIGTERM and SIGINT reach the harness directly (it is in the same process group);
the launcher outlives it to clean up. SIGKILL to the group kills bubblewrap,
and with it (`--die-with-parent`, its process namespaces) everything inside.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO

from pydantic import ValidationError

from infra.sandbox import cgroups
from infra.sandbox import policy as sandbox
from infra.sandbox.errors import PolicyError, SandboxError, SandboxUnavailable
from infra.sandbox.policy import Gateway, Layout, Policy

INSIDE = Path(__file__).with_name("inside.py")
#: the launcher's own exit status when it could not make the sandbox (as `env` and `timeout` use it)
CANNOT_SANDBOX = 125
CHUNK = 65536
MAX_CONNECTIONS = 256
SYS_KEYCTL = {"x86_64": 250, "aarch64": 219, "riscv64": 219, "ppc64le": 271, "s390x": 280}
KEYCTL_JOIN_SESSION_KEYRING = 1


def say(message: str) -> None:
    print(f"tether sandbox: {message}", file=sys.stderr, flush=True)


def layout(folder: Path, gateway: Gateway, uid: int, gid: int) -> Layout:
    """The machine as the plan needs it, and this sandbox's /etc files, written in `folder`: a hosts file with the
    gateway's host name on loopback, and the agent's user and group by name."""
    system = tuple((p, os.readlink(p) if os.path.islink(p) else None) for p in sandbox.SYSTEM if os.path.lexists(p))
    interpreter = {sys.prefix, sys.base_prefix, sys.exec_prefix, str(Path(sys.executable).parent.parent)}
    lines = {"/etc/hosts": f"127.0.0.1 localhost {gateway.name or ''}\n::1 localhost ip6-localhost\n",
             "/etc/passwd": f"root:x:0:0:root:/root:/bin/sh\nagent:x:{uid}:{gid}:agent:{sandbox.HOME}:/bin/sh\n"
                            "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
             "/etc/group": f"root:x:0:\nagent:x:{gid}:\nnogroup:x:65534:\n"}
    etc = []
    for target, text in lines.items():
        path = folder / Path(target).name
        path.write_text(text)
        path.chmod(0o644)
        etc.append((target, str(path)))
    return Layout(system, tuple(sorted(os.path.realpath(p) for p in interpreter)), tuple(etc))


#: root's: the locks that give each running sandbox its own user (not under TMPDIR, which a run file can set)
USERS = Path("/run/tether-sandbox-users")


def own_folder(path: Path) -> Path:
    """`path`, made if missing, refused unless it is a folder of this user's that nobody else may write."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise SandboxUnavailable(f"{path} is not a folder of this user's that only it may write: remove it")
    return path


class Identity:
    """The sandbox's user and group, and (root) the lock that makes them its own while it runs."""

    def __init__(self, policy: Policy) -> None:
        self._lock: IO[bytes] | None = None
        if os.geteuid() != 0:
            self.uid, self.gid = os.geteuid(), os.getegid()
            return
        locks = own_folder(USERS)
        for uid in range(policy.uid, policy.uid + sandbox.UIDS):
            handle = os.fdopen(os.open(locks / str(uid), os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                                       0o600), "ab")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                continue
            self._lock, self.uid, self.gid = handle, uid, uid
            return
        raise SandboxUnavailable(f"all {sandbox.UIDS} sandbox users from {policy.uid} are taken")

    def release(self) -> None:
        if self._lock is not None:
            self._lock.close()


def give(folder: Path, uid: int, gid: int) -> None:
    """`folder` and everything in it owned by the sandbox's user: links themselves, never what they name; a file
    with other hard links copied first (its other names stay as they were); nothing on another filesystem."""
    device = folder.lstat().st_dev
    for parent, folders, files in os.walk(folder):
        for name in [*folders, *files]:
            path = os.path.join(parent, name)
            info = os.lstat(path)
            if info.st_dev != device:
                raise PolicyError(f"sandbox: {path} is on another filesystem than {folder} (a mount in it)")
            if stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
                handle, copy = tempfile.mkstemp(dir=parent, prefix=".tether-unlink-")  # O_EXCL: a new file
                with os.fdopen(handle, "wb") as out, open(path, "rb") as original:
                    shutil.copyfileobj(original, out)
                shutil.copystat(path, copy, follow_symlinks=False)
                os.replace(copy, path)
            os.chown(path, uid, gid, follow_symlinks=False)
    os.chown(folder, uid, gid, follow_symlinks=False)


def resolve(policy: Policy) -> Policy:
    """Every path real (links resolved), nothing made yet: what `plan` checks is what will be bound."""
    workdir = os.path.realpath(policy.workdir)
    if not os.path.isdir(workdir):
        raise PolicyError(f"sandbox.workdir {policy.workdir}: not a folder (its set-up makes it)")
    return policy.model_copy(update={"workdir": workdir, "writable": [os.path.realpath(p) for p in policy.writable],
                                     "read_only": [p for p in map(os.path.realpath, policy.read_only)
                                                   if os.path.exists(p)],
                                     "hide": [os.path.realpath(p) for p in policy.hide]})


def prepare(policy: Policy, identity: Identity) -> None:
    """The writable folders made, and with the working copy the sandbox user's (where the launcher is root)."""
    for path in policy.writable:
        Path(path).mkdir(parents=True, exist_ok=True)
        if Path(path).is_symlink() or not Path(path).is_dir():
            raise PolicyError(f"sandbox.writable {path}: not a folder")
    if os.geteuid() == 0:
        for path in sandbox.writable_of(policy):
            give(Path(path), identity.uid, identity.gid)


class Relay:
    """The gateway's only way in: a Unix socket whose every connection goes to the gateway's host and port."""

    def __init__(self, folder: Path, upstream: tuple[str, int]) -> None:
        self.path = folder / "gateway.sock"
        self.upstream = upstream
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(self.path))
        os.chmod(self.path, 0o666)  # the sandbox's user connects; the folder is the launcher's
        self.listener.listen(128)
        self._open = 0

    async def serve(self) -> asyncio.Server:
        return await asyncio.start_unix_server(self._one, sock=self.listener)

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._open >= MAX_CONNECTIONS:  # a sandbox that opens more only loses its own
            writer.close()
            return
        self._open += 1
        try:
            try:
                up_reader, up_writer = await asyncio.open_connection(*self.upstream)
            except OSError:
                return
            try:
                await asyncio.gather(_pump(reader, up_writer), _pump(up_reader, writer), return_exceptions=True)
            finally:
                up_writer.close()
        except asyncio.CancelledError:
            pass  # the sandbox ended with the connection open: nothing to say in its log
        finally:
            self._open -= 1
            writer.close()


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(CHUNK):
            writer.write(chunk)
            await writer.drain()
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            if writer.can_write_eof():
                writer.write_eof()


def stage_spec(policy: Policy, identity: Identity) -> str:
    copies = [[f"{sandbox.KEEP}/{i}", folder] for i, folder in enumerate(sandbox.writable_of(policy))]
    return json.dumps({"uid": identity.uid, "gid": identity.gid, "copies": copies,
                       "disk": policy.limits.disk_mb * 1024 * 1024, "files": policy.limits.files})


def agent_spec(policy: Policy, gateway: Gateway) -> str:
    limits = policy.limits
    rlimits = {"RLIMIT_NPROC": limits.processes, "RLIMIT_FSIZE": limits.file_mb * 1024 * 1024,
               "RLIMIT_NOFILE": limits.open_files, "RLIMIT_CORE": 0}
    return json.dumps({"rlimits": rlimits, "listen": list(gateway.listen), "port": gateway.inside_port,
                       "socket": sandbox.SOCKET})


def environment() -> dict[str, str]:
    """The harness's environment as the runner gave it, with a home and scratch of the sandbox's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "DBUS_", "SSH_AUTH", "KRB5"))}
    env.update(HOME=sandbox.HOME, TMPDIR="/tmp", USER="agent", LOGNAME="agent")
    return env


def has_terminal() -> bool:
    """Whether this process has a controlling terminal (run by hand): the agent then gets a session of its own,
    so that nothing it does can push input into that terminal."""
    try:
        os.close(os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY))
        return True
    except OSError:
        return False


def _group_name() -> str:
    rollout = re.sub(r"[^A-Za-z0-9._-]", "_", os.environ.get("TETHER_ROLLOUT_ID", "sandbox"))[:100]
    return f"tether-{rollout}-{os.getpid()}"


def hold(workdir: str) -> int:
    """The working copy, locked for this sandbox's life: two sandboxes copying one folder back would tear it."""
    handle = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(handle)
        raise PolicyError(f"sandbox.workdir {workdir} is another running sandbox's: give each rollout its own "
                          "(work/{rollout_id}, say)") from None
    return handle


def sweep() -> None:
    """What launchers killed before they could clean up left: their private folders (named by their pid), and
    empty cgroups of this launcher's kind (`cgroups.sweep`)."""
    for folder in Path(tempfile.gettempdir()).glob("tether-sandbox-*-*"):
        pid = folder.name.split("-")[2]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists() and folder.lstat().st_uid == os.geteuid():
            shutil.rmtree(folder, ignore_errors=True)
    cgroups.sweep()


def _own_keyring() -> None:
    """A new session keyring: nothing the launcher's session holds is the sandbox's to read or write."""
    number = SYS_KEYCTL.get(os.uname().machine)
    if number is not None:
        ctypes.CDLL(None, use_errno=True).syscall(number, KEYCTL_JOIN_SESSION_KEYRING, None)


async def _supervise(process: subprocess.Popen[bytes], relay: Relay, alone: bool) -> int:
    """Until bubblewrap ends. A signal reaches the harness directly, in the same process group, and this process
    stays to clean up; `alone` (the agent in a session of its own, out of reach of the terminal's signals), a
    signal ends the sandbox."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, process.kill if alone else lambda: None)
    server = await relay.serve()
    code = await loop.run_in_executor(None, process.wait)
    server.close()
    return code


def run(policy: Policy, command: list[str]) -> int:
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable("bubblewrap is not installed (Debian: apt-get install bubblewrap)")
    gateway = sandbox.gateway_of(policy.gateway)
    sweep()
    identity = Identity(policy)
    folder = Path(tempfile.mkdtemp(prefix=f"tether-sandbox-{os.getpid()}-"))
    group: cgroups.Cgroup | None = None
    held: int | None = None
    try:
        folder.chmod(0o755)  # bubblewrap, as the sandbox's user where the launcher is not root, binds from here
        real = resolve(policy)
        mounts = sandbox.plan(real, layout(folder, gateway, identity.uid, identity.gid))  # checked: now change
        held = hold(real.workdir)
        prepare(real, identity)
        relay = Relay(folder, (gateway.name or gateway.listen[0], gateway.port))
        python = [sys.executable, "-I", "-S", sandbox.INSIDE]
        new_session = has_terminal()
        options = sandbox.root_argv(mounts, socket=str(relay.path), inside=str(INSIDE), privileged=os.geteuid() == 0)
        command = [*python, "stage", stage_spec(real, identity), "--",
                   *sandbox.jail_argv(bwrap, workdir=real.workdir, uid=identity.uid, gid=identity.gid,
                                      new_session=new_session),
                   "--", *python, "agent", agent_spec(real, gateway), "--", *command]
        limits = policy.limits
        group, how = cgroups.make(_group_name(), limits.memory_mb, limits.processes, limits.cpus)
        if group is None and limits.cgroup:
            raise SandboxUnavailable(f"{how}; set sandbox.limits.cgroup: false to run without one")
        if group is None:
            say(how)

        def enter() -> None:  # in the child, before bubblewrap: no thread exists yet in this process
            if group is not None:
                group.join()
            _own_keyring()

        with tempfile.TemporaryFile() as listed:
            listed.write(b"".join(a.encode() + b"\0" for a in options))  # the mounts: nobody inside lists them
            listed.flush()
            listed.seek(0)
            process = subprocess.Popen([bwrap, "--args", str(listed.fileno()), "--", *command], env=environment(),
                                       preexec_fn=enter, pass_fds=[listed.fileno()])
        code = asyncio.run(_supervise(process, relay, new_session))
        if group is not None and group.oom_kills():
            say(f"the memory limit ({limits.memory_mb} MB) killed {group.oom_kills()} process(es)")
        return code if code >= 0 else 128 - code
    finally:
        if group is not None:
            group.remove()
        shutil.rmtree(folder, ignore_errors=True)
        identity.release()
        if held is not None:
            os.close(held)


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
