"""The graded run's filesystem: a root of its own, made from an allowlist inside a mount namespace before
anything graded runs.

Run by path as `python -I -S jail.py SPEC -- COMMAND...` under `unshare -rm`
(see `swe.isolate.jailed`): standard library only, no site-packages, nothing
from the graded copy. In order:

1. every mount is remounted read-only, so that whatever is bound from it
   stays read-only;
2. a new root (a small tmpfs on `root`, an empty folder the grader made) gets
   only what a test run needs, read-only:
   `/usr`, `/etc`, `/dev`, the system's library and binary folders, the
   interpreter and its environment (`keep`), and the grader's replay script.
   Nothing else of the machine is there: not the tasks folder (the clean tree,
   the private data), not the package's release in a download cache, not the
   home folder, not `/sys` and its cgroups, not other gradings' folders;
3. the graded copy (`work`) is a tmpfs of `WORK_MB` at its own path, filled
   with a copy of the tree; the report's folder (`out`) is a tmpfs too, and
   `/tmp`, `/var/tmp` and `/dev/shm` are empty ones: what the run writes is
   bounded and vanishes with it;
4. the process moves into the new root (`pivot_root`) and lets the old one
   go: nothing outside the allowlist can be reached, not even by `..`;
5. what was promised is checked, then the command runs in a user and mount
   namespace nested in this one, where these mounts are locked. This process
   waits for it and copies the files named in `collect` (the JUnit report)
   from `out` to the real folder: regular files, no links, at most
   `MAX_COLLECT` bytes each.

Any step that fails exits with status 97 and says which on stderr: the grader
refuses to grade rather than grade in a filesystem it did not make.
"""

import ctypes
import json
import os
import shutil
import stat
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC = 1, 2, 4, 32, 4096, 16384
MNT_DETACH = 2
#: filesystems left as they are by the read-only pass: the kernel's views (none is bound into the new root)
SPECIAL = frozenset({"proc", "sysfs", "cgroup", "cgroup2", "devpts", "mqueue", "securityfs", "debugfs",
                     "tracefs", "pstore", "bpf", "fusectl", "configfs", "binfmt_misc", "hugetlbfs", "autofs"})
#: statvfs(3)'s ST_* flag → mount(2)'s MS_* flag: nosuid, nodev, noexec, noatime, nodiratime, relatime
STATVFS_TO_MOUNT = ((2, MS_NOSUID), (4, MS_NODEV), (8, 8), (1024, 1024), (2048, 2048), (4096, 1 << 21))
#: what a run needs of the machine, where it exists (a link such as `/bin` → `usr/bin` is made again as a link)
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/dev")
SCRATCH = ("/tmp", "/var/tmp", "/dev/shm")
WORK_MB, OUT_MB, SCRATCH_MB, ROOT_MB = 512, 64, 256, 16
MAX_COLLECT = 32 * 1024 * 1024
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
FAILED = 97

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(_libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None, flags,
                       data.encode() if data else None), f"mount {source} on {target}")


def mounts() -> list[tuple[str, str]]:
    """(mount point, filesystem type) of every mount, parents before children."""
    found = []
    with open("/proc/self/mountinfo") as info:
        for line in info:
            fields = line.split()
            point = fields[4].encode().decode("unicode_escape")  # octal escapes: \040 for a space
            found.append((point, fields[fields.index("-") + 1]))
    return found


def kept_flags(point: str) -> int:
    """The mount's flags, as mount(2) takes them, from what statvfs(3) reports."""
    reported = os.statvfs(point).f_flag
    return sum(flag for st, flag in STATVFS_TO_MOUNT if reported & st)


def read_only_everywhere() -> None:
    for point, fstype in mounts():
        if fstype in SPECIAL or not os.path.isdir(point):
            continue
        try:
            # a remount names every flag the mount keeps: in a user namespace, dropping a locked one is refused
            mount("none", point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | kept_flags(point))
        except OSError as exc:
            if exc.errno not in (1, 13, 22):  # EPERM, EACCES, EINVAL: what must hold is checked afterwards
                raise


def bind(source: str, root: str, *, recursive: bool = True) -> None:
    """`source` at the same path under `root`, read-only as its source now is."""
    target = root + source
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "a"):
            pass
    mount(source, target, None, MS_BIND | (MS_REC if recursive else 0))


def tmpfs(target: str, megabytes: int, mode: str = "1777") -> None:
    os.makedirs(target, exist_ok=True)
    mount("tether-private", target, "tmpfs", MS_NOSUID | MS_NODEV, f"size={megabytes}m,mode={mode}")


def build_root(spec: dict[str, object], root: str) -> None:
    tmpfs(root, ROOT_MB, "755")
    for path in SYSTEM:
        if os.path.islink(path):
            os.symlink(os.readlink(path), root + path)
        elif os.path.isdir(path):
            bind(path, root)
    for path in sorted({str(p) for p in spec["keep"]}, key=len):  # type: ignore[attr-defined]
        if os.path.exists(path) and not any(path.startswith(s.rstrip("/") + "/") or path == s
                                            for s in SYSTEM if not os.path.islink(s)):
            bind(path, root)
    for path in SCRATCH:
        tmpfs(root + path, SCRATCH_MB)
    work, out = str(spec["work"]), str(spec["out"])
    tmpfs(root + work, WORK_MB, "755")
    shutil.copytree(work, root + work, symlinks=True, dirs_exist_ok=True)
    tmpfs(root + out, OUT_MB, "755")
    os.makedirs(root + "/proc", exist_ok=True)
    bind("/proc", root)  # a new /proc for the run's own process namespace is mounted over this one
    os.makedirs(root + "/.old", exist_ok=True)
    mount("none", root, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)  # its folders are made


def pivot(root: str) -> None:
    number = SYS_PIVOT_ROOT.get(os.uname().machine)
    if number is None:
        raise OSError(0, f"pivot_root: no system call number known for {os.uname().machine}")
    os.chdir(root)
    _check(_libc.syscall(number, b".", b".old"), "pivot_root")
    os.chdir("/")
    _check(_libc.umount2(b"/.old", MNT_DETACH), "umount the old root")


def collect(out: str, into: int, names: list[str]) -> None:
    """Copy each named file of `out` (in the jail) to the real folder open as `into`: plain files only. One that
    is there but is not (a link, a pipe) comes back as `NAME.refused`, holding why."""
    for name in names:
        try:
            source = os.open(os.path.join(out, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            continue  # none written: the grader sees no report
        except OSError as exc:
            _write(into, f"{name}.refused", f"{name} cannot be opened as a plain file: {exc.strerror}".encode())
            continue
        try:
            if not stat.S_ISREG(os.fstat(source).st_mode):
                _write(into, f"{name}.refused", f"{name} is not a regular file".encode())
                continue
            data = b""
            while len(data) <= MAX_COLLECT:
                chunk = os.read(source, MAX_COLLECT + 1 - len(data))
                if not chunk:
                    break
                data += chunk
        finally:
            os.close(source)
        _write(into, name, data)


def _write(into: int, name: str, data: bytes) -> None:
    target = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=into)
    try:
        os.write(target, data)
    finally:
        os.close(target)


def main(argv: list[str]) -> int:
    spec = json.loads(argv[1])
    command = argv[argv.index("--") + 1:]
    work, out, root = str(spec["work"]), str(spec["out"]), str(spec["root"])
    try:
        mount(out, out, None, MS_BIND)  # a mount of its own, writable again after the read-only pass
        read_only_everywhere()
        mount("none", out, None, MS_REMOUNT | MS_BIND | kept_flags(out) & ~MS_RDONLY)
        into = os.open(out, os.O_DIRECTORY)
        build_root(spec, root)
        pivot(root)
        problems = [f"{p} is not writable" for p in (work, out, "/tmp") if not os.access(p, os.W_OK)]
        problems += [f"{p} is writable" for p in spec["keep"] if os.path.exists(p) and os.access(p, os.W_OK)]
        problems += [f"{p} can be seen" for p in spec["hide"] if os.path.exists(p)]
        if problems:
            raise OSError(0, "; ".join(problems))
        os.makedirs(os.path.join(out, "home"), exist_ok=True)
        os.chdir(work)
    except OSError as exc:
        print(f"tether jail: {exc}", file=sys.stderr)
        return FAILED
    child = os.fork()
    if child == 0:
        try:
            os.execv(command[0], command)
        finally:
            os._exit(127)
    _, status = os.waitpid(child, 0)
    collect(out, into, spec["collect"])
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
