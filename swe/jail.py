"""The graded run's filesystem, set up inside a mount namespace of its own before anything graded runs.

Run by path as `python -I -S jail.py SPEC -- COMMAND...` under `unshare -rm`
(see `swe.sandbox`): standard library only, no site-packages, nothing from the
graded copy. In order:

1. every mount is remounted read-only (the interpreter, site-packages, the
   grader's own code, the user's files: readable, never writable);
2. the folders to hide get an empty tmpfs each (the tasks folder: its clean
   tree and private instances), and so do the places anyone may write
   (`/tmp`, `/var/tmp`, `/dev/shm`, the user's home): the run writes to a
   private scratch that vanishes with it, and sees no other grading's folders;
3. what the run needs from under those folders (the interpreter, where it
   lives in the user's home) is bound back, read-only; and the graded copy and
   the report's folder, held open across step 2, are bound back at their own
   paths, writable: all the run can change that outlives it;
4. what was promised is checked (the graded copy writable, the interpreter and
   each hidden folder not), and the command runs in a user and mount namespace
   nested in this one, where these mounts are locked: root there cannot undo
   them.

Any step that fails exits with status 97 and says which on stderr: the grader
refuses to grade rather than grade in a filesystem it did not make.
"""

import ctypes
import json
import os
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC = 1, 2, 4, 32, 4096, 16384
#: filesystems left as they are: the kernel's views (a new /proc comes with the nested namespace)
SPECIAL = frozenset({"proc", "sysfs", "cgroup", "cgroup2", "devpts", "mqueue", "securityfs", "debugfs",
                     "tracefs", "pstore", "bpf", "fusectl", "configfs", "binfmt_misc", "hugetlbfs", "autofs"})
#: statvfs(3)'s ST_* flag → mount(2)'s MS_* flag: nosuid, nodev, noexec, noatime, nodiratime, relatime
STATVFS_TO_MOUNT = ((2, MS_NOSUID), (4, MS_NODEV), (8, 8), (1024, 1024), (2048, 2048), (4096, 1 << 21))
SCRATCH = ("/tmp", "/var/tmp", "/dev/shm")
FAILED = 97

_libc = ctypes.CDLL(None, use_errno=True)


def mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    if _libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None, flags,
                   data.encode() if data else None) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {source} on {target}: {os.strerror(errno)}")


def mounts() -> list[tuple[str, str]]:
    """(mount point, filesystem type) of every mount, parents before children."""
    found = []
    with open("/proc/self/mountinfo") as info:
        for line in info:
            fields = line.split()
            point = fields[4].encode().decode("unicode_escape")  # octal escapes: \040 for a space
            fstype = fields[fields.index("-") + 1]
            found.append((point, fstype))
    return found


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


def kept_flags(point: str) -> int:
    """The mount's flags, as mount(2) takes them, from what statvfs(3) reports."""
    reported = os.statvfs(point).f_flag
    return sum(flag for st, flag in STATVFS_TO_MOUNT if reported & st)


def main(argv: list[str]) -> int:
    spec = json.loads(argv[1])
    command = argv[argv.index("--") + 1:]
    writable: list[str] = spec["writable"]
    hide: list[str] = spec["hide"]
    read_only: list[str] = spec["read_only"]
    home: str = spec["home"]
    try:
        held = {path: os.open(path, os.O_PATH | os.O_DIRECTORY) for path in writable}
        kept = {path: os.open(path, os.O_PATH | os.O_DIRECTORY) for path in spec["keep"] if os.path.isdir(path)}
        read_only_everywhere()
        covered = sorted({*hide, *(p for p in SCRATCH if os.path.isdir(p)),
                          *([home] if home and os.path.isdir(home) else [])}, key=len)
        done: list[str] = []
        for path in covered:
            if not any(path == d or path.startswith(d.rstrip("/") + "/") for d in done):  # else hidden already
                mount("tether-private", path, "tmpfs", MS_NOSUID | MS_NODEV, "size=256m,mode=1777")
                done.append(path)
        for path, fd in sorted(kept.items()):  # read-only still: a bind keeps its source's flags
            if any(path.startswith(d.rstrip("/") + "/") for d in done):
                os.makedirs(path, exist_ok=True)
                mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
            os.close(fd)
        for path, fd in held.items():
            os.makedirs(path, exist_ok=True)
            mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
            mount("none", path, None, MS_REMOUNT | MS_BIND)  # writable again: its source is read-only now
            os.close(fd)
        if home:
            os.makedirs(home, exist_ok=True)
        problems = [f"{p} is not writable" for p in writable if not os.access(p, os.W_OK)]
        problems += [f"{p} is writable" for p in read_only if os.path.exists(p) and os.access(p, os.W_OK)]
        problems += [f"{p} is not empty" for p in hide if os.path.isdir(p) and os.listdir(p)]
        if problems:
            raise OSError("; ".join(problems))
    except OSError as exc:
        print(f"tether jail: {exc}", file=sys.stderr)
        return FAILED
    os.chdir(writable[0])
    os.execv(command[0], command)
    return FAILED  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv))
