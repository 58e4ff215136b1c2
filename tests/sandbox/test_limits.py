"""What one rollout may take of the machine, each attack made from the agent's side: processes, memory,
disk, and what is copied back."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra.sandbox import cgroups
from tests.sandbox.support import Server, sandboxed


def test_processes_are_bounded_per_sandbox_and_the_machine_keeps_its_own(
        site: Path, servers: tuple[Server, Server]) -> None:
    bomb = ("import os, time\nn = 0\nfor _ in range(200):\n    try:\n        pid = os.fork()\n"
            "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(20)\n        os._exit(0)\n"
            "    n += 1\nprint(n)\n")
    (site / "work" / "mine" / "bomb.py").write_text(bomb)
    done = sandboxed(site, servers[0], f"{sys.executable} bomb.py", limits={"processes": 48})
    assert 30 <= int(done.stdout.split()[-1]) < 48, done.stdout + done.stderr
    assert subprocess.run(["true"], check=False).returncode == 0  # the machine forks as before


def test_memory_is_bounded_for_the_whole_sandbox(site: Path, servers: tuple[Server, Server]) -> None:
    group, how = cgroups.make(f"tether-probe-{os.getpid()}", 64, 64)
    if group is None:
        pytest.fail(f"no cgroup here to bound memory with: {how}")
    group.remove()
    hog = f"{sys.executable} -c \"b = bytearray(512 * 1024 * 1024); b[::4096] = b'x' * len(b[::4096]); print('ALL')\""
    done = sandboxed(site, servers[0], hog, limits={"memory_mb": 128})
    assert "ALL" not in done.stdout and done.returncode != 0
    assert "memory limit" in done.stderr or done.returncode in (137, 128 + 9), done.stderr


def test_disk_is_bounded_when_written_and_the_machine_never_sees_more(site: Path,
                                                                      servers: tuple[Server, Server]) -> None:
    """The working copy is a tmpfs of disk_mb, copied back at the end: a burst (fallocate), a file held open after
    its unlinking, a tree too deep to walk, none of them reach the machine's disk beyond the limit."""
    script = ("for i in 1 2 3 4 5 6; do head -c 4000000 /dev/zero > /tmp/f$i || echo TMP-FULL; done; "
              "dd if=/dev/zero of=big bs=1M count=64 2>/dev/null || echo TOO-LARGE; rm -f big; "
              "fallocate -l 200M burst 2>/dev/null || echo BURST-REFUSED; rm -f burst; "
              "exec 3>held; rm held; head -c 30000000 /dev/zero >&3 || echo HELD-FULL; "
              "d=.; for i in $(seq 30); do d=$d/$(printf %0200d 0); done; mkdir -p $d && "
              "head -c 8000000 /dev/zero > $d/deep || echo DEEP-FULL; echo done")
    done = sandboxed(site, servers[0], script, limits={"tmp_mb": 16, "file_mb": 8, "disk_mb": 24})
    said = done.stdout.split()
    assert said[0] == "TMP-FULL" and said[-5:] == ["TOO-LARGE", "BURST-REFUSED", "HELD-FULL", "DEEP-FULL", "done"], \
        done.stdout + done.stderr
    assert done.returncode == 0, done.stderr  # the deep tree came back too
    du = subprocess.run(["du", "-sb", str(site / "work" / "mine")], capture_output=True, text=True, check=True)
    assert int(du.stdout.split()[0]) <= 24 * 1024 * 1024  # (du walks a tree too deep for a path)


def test_the_agent_s_work_comes_back_as_files_and_nothing_else(site: Path, servers: tuple[Server, Server]) -> None:
    (site / "work" / "mine" / "gone.py").write_text("deleted by the agent\n")
    (site / "work" / "mine" / "read-only").mkdir()
    (site / "work" / "mine" / "read-only" / "kept").write_text("kept\n")
    (site / "work" / "mine" / "read-only").chmod(0o555)
    done = sandboxed(site, servers[0], "rm gone.py && mkfifo pipe && ln -s /etc/shadow shadow && mkdir -p a/b && "
                                       "echo new > a/b/new.py && chmod 4755 a/b/new.py && echo ok")
    assert done.stdout == "ok\n" and done.returncode == 0, done.stderr
    mine = site / "work" / "mine"
    assert sorted(p.name for p in mine.iterdir()) == ["a", "code.py", "read-only", "shadow"]
    new = mine / "a" / "b" / "new.py"
    assert new.read_text() == "new\n" and not new.stat().st_mode & 0o4000
    assert os.readlink(mine / "shadow") == "/etc/shadow" and (mine / "read-only" / "kept").read_text() == "kept\n"


def test_what_comes_back_is_bounded_too(site: Path, servers: tuple[Server, Server]) -> None:
    """A sparse file's holes and a file's hard links take little of the tmpfs and would come back whole: the copy
    back counts every byte it writes, and stops."""
    done = sandboxed(site, servers[0], "truncate -s 400M sparse && head -c 1000000 /dev/zero > f && "
                                       "for i in $(seq 50); do ln f link$i; done; echo made",
                     limits={"disk_mb": 30})
    assert done.stdout == "made\n" and done.returncode == 125 and "would be written" in done.stderr, done.stderr
    du = subprocess.run(["du", "-sb", str(site / "work" / "mine")], capture_output=True, text=True, check=True)
    assert int(du.stdout.split()[0]) <= 30 * 1024 * 1024


def test_entries_the_agent_locked_itself_out_of_still_come_back(site: Path, servers: tuple[Server, Server]) -> None:
    done = sandboxed(site, servers[0], "mkdir -p d && echo x > d/f && echo y > g && chmod 000 d/f g d && echo ok")
    assert done.returncode == 0, done.stderr
    mine = site / "work" / "mine"
    assert (mine / "g").stat().st_mode & 0o777 == 0 and (mine / "d").is_dir()
