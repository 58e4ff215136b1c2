"""The graded run's filesystem: a root of its own, made from an allowlist inside a mount namespace before
anything graded runs.

Run by path as `python -I -S jail.py SPEC -- COMMAND...` (see
`swe.isolate.jailed`): standard library only, no site-packages, nothing from
the graded copy. It makes its own user namespaces, writing their id maps
itself: the jail's maps root (and, where the grader is root, `nobody`), and
the run's maps its root to `nobody` outside, so that nothing the run does
counts as the machine's root (the kernel's settings under `/proc/sys`, other
processes' files). In order:

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
5. what was promised is checked, then the command runs in a process
   namespace of its own, with a `/proc` of that namespace mounted here (so the
   machine's processes are not there, and the mount is locked for the run),
   and in a user and mount namespace nested in this one, where every mount is
   locked: root there cannot undo them. This process waits for it and copies
   the files named in `collect` (the JUnit report) from `out` to the real
   folder: regular files, no links, at most `MAX_COLLECT` bytes each.

Any step that fails exits with status 97 and says which on stderr: the grader
refuses to grade rather than grade in a filesystem it did not make.
"""

import ctypes
import json
import os
import shutil
import stat
import sys
from typing import Any

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC = 1, 2, 4, 32, 4096, 16384
MNT_DETACH = 2
#: filesystems left as they are by the read-only pass: the kernel's views (none is bound into the new root)
SPECIAL = frozenset({"proc", "sysfs", "cgroup", "cgroup2", "devpts", "mqueue", "securityfs", "debugfs",
                     "tracefs", "pstore", "bpf", "fusectl", "configfs", "binfmt_misc", "hugetlbfs", "autofs"})
#: statvfs(3)'s ST_* flag → mount(2)'s MS_* flag: nosuid, nodev, noexec, noatime, nodiratime, relatime
STATVFS_TO_MOUNT = ((2, MS_NOSUID), (4, MS_NODEV), (8, 8), (1024, 1024), (2048, 2048), (4096, 1 << 21))
#: what a run needs of the machine, where it exists (a link such as `/bin` → `usr/bin` is made again as a link)
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
#: the devices a run may use, bound one by one into an otherwise empty /dev (no disks, no kernel log)
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty")
SCRATCH = ("/tmp", "/var/tmp", "/dev/shm")
WORK_MB, OUT_MB, SCRATCH_MB, ROOT_MB = 512, 64, 256, 16
MAX_COLLECT = 32 * 1024 * 1024
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
FAILED = 97
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID = 0x00020000, 0x10000000, 0x20000000
PR_SET_PDEATHSIG = 1
NOBODY = 65534

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


def build_root(spec: dict[str, Any], root: str) -> None:
    tmpfs(root, ROOT_MB, "755")
    for path in SYSTEM:
        if os.path.islink(path):
            os.symlink(os.readlink(path), root + path)
        elif os.path.isdir(path):
            bind(path, root)
    tmpfs(root + "/dev", 1, "755")
    for device in DEVICES:
        if os.path.exists(device):
            bind(device, root, recursive=False)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{root}/dev/{name}")
    for path in SCRATCH:
        tmpfs(root + path, SCRATCH_MB)
    # after the empty folders: what the run needs may live under one of them (a checkout in /tmp, say)
    for path in sorted({str(p) for p in spec["keep"]}, key=len):
        if os.path.exists(path) and not any(path.startswith(s.rstrip("/") + "/") or path == s
                                            for s in SYSTEM if not os.path.islink(s)):
            bind(path, root)
    work, out = str(spec["work"]), str(spec["out"])
    tmpfs(root + work, WORK_MB, "755")
    shutil.copytree(work, root + work, symlinks=True, dirs_exist_ok=True)
    tmpfs(root + out, OUT_MB, "755")
    os.makedirs(root + out + "/home")
    for top in (root + work, root + out):  # the run's own, as the run's identity sees it
        _own(top, int(spec["owner"]))
    os.makedirs(root + "/proc", exist_ok=True)
    bind("/proc", root)  # a new /proc for the run's own process namespace is mounted over this one
    os.makedirs(root + "/.old", exist_ok=True)
    mount("none", root, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)  # its folders are made


def _own(top: str, owner: int) -> None:
    for folder, folders, files in os.walk(top):
        for name in [*folders, *files]:
            os.chown(os.path.join(folder, name), owner, owner, follow_symlinks=False)
    os.chown(top, owner, owner)


def unshare(flags: int) -> None:
    _check(_libc.unshare(flags), "unshare")


def die_with_parent() -> None:
    _check(_libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0), "prctl")


def write_maps(pid: int, inside: int, outside: int, extra: tuple[int, ...] = ()) -> None:
    """Map `inside` to `outside` (and each of `extra` to itself) in the user namespace of `pid`."""
    lines = "".join([f"{inside} {outside} 1\n", *(f"{i} {i} 1\n" for i in extra)])
    if os.path.exists(f"/proc/{pid}/setgroups") and os.geteuid() != 0:
        with open(f"/proc/{pid}/setgroups", "w") as setgroups:
            setgroups.write("deny")
    for name in ("uid_map", "gid_map"):
        with open(f"/proc/{pid}/{name}", "w") as table:
            table.write(lines)


def in_new_user_namespace(flags: int, maps: tuple[int, int, tuple[int, ...]]) -> int:
    """Fork; the child enters new namespaces (`flags`, a user namespace among them) and returns 0 once this
    process, still outside, has written its id maps; this process returns the child's pid."""
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(ready_r)
        os.close(go_w)
        die_with_parent()
        unshare(flags)
        os.write(ready_w, b"1")
        if os.read(go_r, 1) != b"1":
            os._exit(FAILED)
        os.setgid(0)
        os.setuid(0)
        return 0
    os.close(ready_w)
    os.close(go_r)
    try:
        if os.read(ready_r, 1) == b"1":
            write_maps(child, *maps)
            os.write(go_w, b"1")
    finally:
        os.close(ready_r)
        os.close(go_w)
    return child


def status_of(child: int) -> int:
    _, status = os.waitpid(child, 0)
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


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
    spec: dict[str, Any] = json.loads(argv[1])
    command = argv[argv.index("--") + 1:]
    # the jail: root in a user namespace of its own (and `nobody`, where the grader is root, for the run to be)
    root_outside = os.geteuid() == 0
    jail = in_new_user_namespace(CLONE_NEWUSER | CLONE_NEWNS,
                                 (0, os.geteuid(), (NOBODY,) if root_outside else ()))
    if jail:
        return status_of(jail)
    spec["owner"] = NOBODY if root_outside else 0
    return os._exit(jailed(spec, command))


def jailed(spec: dict[str, Any], command: list[str]) -> int:
    """In the jail's namespaces: the new root, then the run, then the report."""
    try:
        into = prepare(spec)
    except OSError as exc:
        print(f"tether jail: {exc}", file=sys.stderr)
        return FAILED
    unshare(CLONE_NEWPID)  # for the run: its first process is the first of a process namespace of its own
    ran = os.fork()
    if ran == 0:
        die_with_parent()
        os._exit(run(spec, command))
    status = status_of(ran)
    collect(str(spec["out"]), into, spec["collect"])
    return status


def prepare(spec: dict[str, Any]) -> int:
    """The new root, entered; the real report folder, open."""
    work, out, root = str(spec["work"]), str(spec["out"]), str(spec["root"])
    mount(out, out, None, MS_BIND)  # a mount of its own, writable again after the read-only pass
    read_only_everywhere()
    mount("none", out, None, MS_REMOUNT | MS_BIND | kept_flags(out) & ~MS_RDONLY)
    into = os.open(out, os.O_DIRECTORY)
    needed = [p for p in spec["keep"] if os.path.exists(p)]
    build_root(spec, root)
    pivot(root)
    problems = [f"{p} can be seen" for p in spec["hide"] if os.path.exists(p)]
    problems += [f"{p} is missing" for p in needed if not os.path.exists(p)]
    problems += [f"{p} is writable" for p in spec["keep"]
                 if os.path.exists(p) and os.access(p, os.W_OK) and p not in (work, out)]
    if problems:
        raise OSError(0, "; ".join(problems))
    return into


def run(spec: dict[str, Any], command: list[str]) -> int:
    """In the run's process namespace: its /proc here (locked for what follows), then a user namespace whose
    root is `owner` outside, and the command."""
    try:
        unshare(CLONE_NEWNS)
        mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | 8)  # noexec
        owner = int(spec["owner"])
        child = in_new_user_namespace(CLONE_NEWUSER | CLONE_NEWNS, (0, owner, ()))
    except OSError as exc:
        print(f"tether jail: {exc}", file=sys.stderr)
        return FAILED
    if child:
        return status_of(child)
    work = str(spec["work"])
    if not os.access(work, os.W_OK):
        print(f"tether jail: {work} is not writable", file=sys.stderr)
        return FAILED
    os.chdir(work)
    try:
        os.execv(command[0], command)
    finally:
        os._exit(127)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
