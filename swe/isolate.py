"""A rollout's agent without sight of the grading data: folders hidden behind empty mounts, in a mount namespace
of its own (`unshare`), where the platform allows one.

The agent still reaches the gateway (the network is not cut: it is how it
talks to the model); a Kubernetes rollout gets the same from its pod, which
mounts only its working copy, and a NetworkPolicy that lets it reach only
the gateway.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from functools import cache
from pathlib import Path

# Each hidden folder gets an empty tmpfs over it. Alone, the working folder's parent gets one too, with the
# working folder bound back into it: its siblings (other rollouts' copies) are gone, its own files are the real
# ones. Then the command runs in a user and mount namespace nested in that one, where those mounts are locked:
# root there cannot unmount them to see what they cover.
SCRIPT = 'unshare="$1"; alone="$2"; shift 2; ' \
         'while [ "$1" != "--" ]; do mount -t tmpfs -o size=64k tether-hidden "$1" || exit 97; shift; done; ' \
         'shift; if [ "$alone" = 1 ]; then ' \
         'here=$(pwd -P); parent=$(dirname "$here"); keep=$(mktemp -d) && mount --bind "$here" "$keep" && ' \
         'mount -t tmpfs -o size=1m tether-hidden "$parent" && mkdir "$here" && mount --bind "$keep" "$here" && ' \
         'umount "$keep" && rmdir "$keep" && cd "$here" || exit 98; fi; ' \
         'exec "$unshare" -rm "$@"'


@cache
def unshare() -> str | None:
    """`unshare`, where it can make user and mount namespaces here."""
    found = shutil.which("unshare")
    if found is None:
        return None
    probe = [found, "-rm", "sh", "-c", SCRIPT, "sh", found, "0", "/tmp", "--", "true"]
    try:
        return found if subprocess.run(probe, capture_output=True, timeout=10).returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def hiding(hidden: Sequence[Path], command: Sequence[str], *, alone: bool = False) -> list[str] | None:
    """The argv that runs `command` with `hidden` folders empty (and, `alone`, the working folder the only thing
    in its parent), or None where no namespaces can be made."""
    found = unshare()
    if found is None:
        return None
    return [found, "-rm", "sh", "-c", SCRIPT, "sh", found, "1" if alone else "0",
            *(str(p.resolve()) for p in hidden), "--", *command]


#: the graded run's filesystem is made by this script, run before anything graded (its docstring says how)
JAIL = Path(__file__).with_name("jail.py")


def jailed(command: Sequence[str], *, work: Path, out: Path, hide: Sequence[Path], collect: Sequence[str] = (),
           python: str = sys.executable) -> list[str] | None:
    """The argv that runs `command` in `work` inside a root of its own (`swe.jail`): the machine's system folders
    and the interpreter read-only, `work` a private copy, `out` a private folder whose `collect` files come back,
    nothing else (`hide` is checked unseen); or None where no jail can be made here (`jail_works`). `out` must
    be an empty folder of the caller's."""
    if not jail_works(python):
        return None
    return [*_jail_argv(python, work, out, hide, collect), *command]


def _jail_argv(python: str, work: Path, out: Path, hide: Sequence[Path], collect: Sequence[str]) -> list[str]:
    interpreter = Path(os.path.realpath(python))
    needed = sorted({sys.prefix, sys.base_prefix, sys.exec_prefix, str(interpreter.parent.parent),
                     str(Path(python).absolute().parent.parent), str(JAIL.parent)})
    root = out / ".root"
    root.mkdir()
    spec = {"work": str(work.resolve()), "out": str(out.resolve()), "root": str(root.resolve()),
            "hide": [str(p.resolve()) for p in hide], "keep": needed, "collect": list(collect)}
    return [python, "-I", "-S", str(JAIL), json.dumps(spec), "--"]


@cache
def jail_works(python: str = sys.executable) -> bool:
    """Whether the jail can be made here: it needs user and mount namespaces and mounts inside them."""
    try:
        with tempfile.TemporaryDirectory(prefix="tether-jail-probe-") as folder:
            work, out = Path(folder) / "work", Path(folder) / "out"
            work.mkdir()
            out.mkdir()
            probe = [*_jail_argv(python, work, out, [], []), "/bin/sh", "-c", "true"]
            return subprocess.run(probe, capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False
