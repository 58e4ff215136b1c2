"""The sandbox's own processes: the first stage's, which copies the agent's folders in and back, and the agent's,
which sets the limits, serves the gateway's relay and runs the harness.

Run by path with the standard library only (`python -I -S inside.py ROLE SPEC
-- COMMAND...`): nothing of Tether need be visible where it runs.

`stage` runs in the first bubblewrap, as root with nothing but the
capabilities to change user (or as the launcher's own user). SPEC holds `uid`,
`gid` and `copies` (pairs of the real folder, bound under KEEP, and its tmpfs
at the folder's own path). As the sandbox's user, with no way to gain
privileges again (no_new_privs), it copies each real folder into its tmpfs,
runs COMMAND (the second bubblewrap), and once that has ended, and with it every
process of the agent (they die with its process namespace), copies each tmpfs
back over the real folder. Regular files, folders and links are copied; pipes,
sockets and devices are not. SIGTERM and SIGINT reach the agent directly (one
process group); this process stays to copy back.

`agent` runs in the second bubblewrap, as the agent's user. SPEC holds
`rlimits` (name → value, soft and hard alike), `listen` and `port` (the
gateway's address as the harness knows it) and `socket` (the launcher's relay,
outside, which reaches the gateway and nothing else). It closes every
descriptor above stderr, sets the limits (kept per sandbox: each has a user
namespace of its own, and no process in it can raise a hard limit), listens on
the gateway's address on the sandbox's own loopback, passes each connection to
the socket, runs the harness and exits as it did (128+N for a death by signal
N). The harness can kill this process or take its port: it then only loses its
own way to the model.
"""

import contextlib
import ctypes
import json
import os
import resource
import signal
import socket
import stat
import subprocess
import sys
import threading

CHUNK = 65536
CANNOT = 125
PR_SET_NO_NEW_PRIVS = 38


def say(message: str) -> None:
    print(f"tether sandbox: {message}", file=sys.stderr, flush=True)


# -- the first stage: the agent's folders in and back --------------------------------------------------------


def become(uid: int, gid: int) -> None:
    """The sandbox's user for good, in this process: no groups, no capabilities, nothing to gain by exec."""
    if os.geteuid() == 0:
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")


#: folders deeper than this are not copied (said in the log: nothing an agent makes that deep is code)
MAX_DEPTH = 256
DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Budget:
    """What a copy may write: bytes (every byte of a file, its holes and each of its hard links' names
    included: that is what the machine's disk receives) and entries. Past either the copy stops."""

    def __init__(self, size: int, entries: int) -> None:
        self.size, self.entries = size, entries

    def take(self, size: int) -> None:
        self.size -= size
        self.entries -= 1
        if self.size < 0 or self.entries < 0:
            raise OSError(27, "more than the sandbox's limits.disk_mb or limits.files would be written")


def clear(folder: int) -> None:
    """Every entry of the folder open as `folder` removed, the folder kept; read-only folders made writable
    first (they are the sandbox user's own)."""
    with os.scandir(folder) as entries:
        names = [(e.name, e.is_dir(follow_symlinks=False)) for e in entries]
    for name, is_folder in names:
        if not is_folder:
            os.unlink(name, dir_fd=folder)
            continue
        os.chmod(name, 0o700, dir_fd=folder, follow_symlinks=False)
        inner = os.open(name, DIRECTORY, dir_fd=folder)
        try:
            clear(inner)
        finally:
            os.close(inner)
        os.rmdir(name, dir_fd=folder)


def copy_file(name: str, source: int, target: int, mode: int, budget: Budget) -> None:
    os.chmod(name, 0o600 | mode, dir_fd=source, follow_symlinks=False)  # its owner may always read it
    src = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=source)
    try:
        info = os.fstat(src)
        if not stat.S_ISREG(info.st_mode):
            return  # swapped since it was listed: not a file, not copied
        budget.take(info.st_size)
        dst = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                      dir_fd=target)
        try:
            while chunk := os.read(src, 1 << 20):
                os.write(dst, chunk)
            os.utime(dst, ns=(info.st_atime_ns, info.st_mtime_ns))
            os.fchmod(dst, mode)
        finally:
            os.close(dst)
    finally:
        os.close(src)


def copy_tree(source: int, target: int, budget: Budget, depth: int = 0) -> None:
    """What the folder open as `source` holds, into the one open as `target`: by descriptors, so no path is too
    long and no link is followed. Folders, regular files and links as links; a file's mode without set-id bits
    or write for others; a pipe, a socket or a device is not the agent's work and is left out."""
    with os.scandir(source) as entries:
        found = [(e.name, e.stat(follow_symlinks=False).st_mode) for e in entries]
    for name, mode in found:
        if stat.S_ISLNK(mode):
            budget.take(0)
            os.symlink(os.readlink(name, dir_fd=source), name, dir_fd=target)
        elif stat.S_ISREG(mode):
            copy_file(name, source, target, mode & 0o755, budget)
        elif stat.S_ISDIR(mode) and depth >= MAX_DEPTH:
            say(f"a folder {MAX_DEPTH} deep is not copied ({name})")
        elif stat.S_ISDIR(mode):
            budget.take(0)
            os.chmod(name, 0o700 | mode, dir_fd=source, follow_symlinks=False)
            os.mkdir(name, 0o700, dir_fd=target)
            inner_source = os.open(name, DIRECTORY, dir_fd=source)
            inner_target = os.open(name, DIRECTORY, dir_fd=target)
            try:
                copy_tree(inner_source, inner_target, budget, depth + 1)
                os.fchmod(inner_target, mode & 0o755)
            finally:
                os.close(inner_source)
                os.close(inner_target)


def mirror(source: str, target: str, budget: Budget) -> None:
    """`target` made to hold what `source` holds (see `copy_tree`)."""
    src, dst = os.open(source, DIRECTORY), os.open(target, DIRECTORY)
    try:
        clear(dst)
        copy_tree(src, dst, budget)
    finally:
        os.close(src)
        os.close(dst)


def as_user(spec: dict, work: "list[tuple[str, str]]") -> bool:  # type: ignore[type-arg]
    """Each (source, target) mirrored, in a child that is the sandbox's user: what it copies it may read."""
    child = os.fork()
    if child == 0:
        code = 0
        try:
            become(int(spec["uid"]), int(spec["gid"]))
            for source, target in work:
                mirror(source, target, Budget(int(spec["disk"]), int(spec["files"])))
        except OSError as exc:
            say(f"copying {exc.filename or ''}: {exc.strerror}")
            code = 1
        except BaseException as exc:  # a tree too deep, say: never a traceback for the agent's making
            say(f"copying: {exc!r}")
            code = 1
        os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) == 0


def stage(spec: dict, command: "list[str]") -> int:  # type: ignore[type-arg]
    copies = [(keep, folder) for keep, folder in spec["copies"]]
    if not as_user(spec, copies):
        say("the working copy could not be copied into the sandbox")
        return CANNOT
    child = os.fork()
    if child == 0:
        try:
            become(int(spec["uid"]), int(spec["gid"]))
            os.execv(command[0], command)
        except OSError as exc:
            say(f"{command[0]}: {exc.strerror}")
        os._exit(CANNOT)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: None)  # the agent has it too; this process stays to copy back
    while True:
        try:
            status = os.waitpid(child, 0)[1]
            break
        except InterruptedError:
            continue
    code = os.waitstatus_to_exitcode(status)
    if not as_user(spec, [(folder, keep) for keep, folder in copies]):
        say("the agent's work could not be copied back out of the sandbox")
        return CANNOT
    return code if code >= 0 else 128 - code


# -- the agent's: limits, the relay, the harness -------------------------------------------------------------


def pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while chunk := source.recv(CHUNK):
            sink.sendall(chunk)
    except OSError:
        pass
    finally:
        for end, how in ((sink, socket.SHUT_WR), (source, socket.SHUT_RD)):
            with contextlib.suppress(OSError):
                end.shutdown(how)


def relay(client: socket.socket, path: str) -> None:
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(path)
    except OSError:
        client.close()
        upstream.close()
        return
    back = threading.Thread(target=pump, args=(upstream, client), daemon=True)
    back.start()
    pump(client, upstream)
    back.join()
    client.close()
    upstream.close()


def serve(listener: socket.socket, path: str) -> None:
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        try:
            threading.Thread(target=relay, args=(client, path), daemon=True).start()
        except RuntimeError:  # no thread to be had under the process limit: this connection is refused
            client.close()


def listen(address: str, port: int) -> "socket.socket | None":
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((address, port))
        listener.listen(128)
    except OSError as exc:
        listener.close()
        if family == socket.AF_INET6:  # no IPv6 inside: the IPv4 listener serves
            return None
        say(f"cannot listen on {address}:{port} for the gateway: {exc}")
        raise SystemExit(CANNOT) from exc
    return listener


def agent(spec: dict, command: "list[str]") -> int:  # type: ignore[type-arg]
    os.closerange(3, 1 << 16)
    for name, value in spec["rlimits"].items():
        resource.setrlimit(getattr(resource, name), (value, value))
    for address in spec["listen"]:
        listener = listen(address, int(spec["port"]))
        if listener is not None:
            threading.Thread(target=serve, args=(listener, spec["socket"]), daemon=True).start()
    try:
        child = subprocess.Popen(command, close_fds=True)
    except OSError as exc:
        say(f"{command[0]}: {exc.strerror}")
        return 127
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda number, _frame: child.send_signal(number))
    while True:
        try:
            code = child.wait()
            break
        except InterruptedError:
            continue
    return code if code >= 0 else 128 - code


def main(argv: "list[str]") -> int:
    role, spec = argv[1], json.loads(argv[2])
    command = argv[argv.index("--") + 1:]
    return stage(spec, command) if role == "stage" else agent(spec, command)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
