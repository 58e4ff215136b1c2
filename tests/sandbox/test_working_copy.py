"""The working copy as the launcher, root, handles it: hard links and planted links, a policy that would
give the agent what it may only read, one sandbox a folder, what a killed launcher leaves."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from infra.sandbox.policy import Policy
from tests.sandbox.support import Server, sandboxed, wait_held


def test_a_hard_link_out_of_the_working_copy_keeps_its_owner(site: Path, servers: tuple[Server, Server]) -> None:
    """A set-up that hard-links files (git clone of a local repository, uv, cp -al): the sandbox's user gets the
    working copy's name for the file, not the file that the tasks folder shares."""
    shared = site / "tasks" / "private" / "instances.jsonl"
    os.link(shared, site / "work" / "mine" / "linked.jsonl")
    owner = shared.stat().st_uid
    done = sandboxed(site, servers[0], "echo forged >> linked.jsonl && echo ok")
    assert done.stdout == "ok\n" and shared.read_text() == "the gold patch\n" and shared.stat().st_uid == owner


def test_a_working_copy_holding_what_the_agent_may_only_read_is_refused(
        site: Path, servers: tuple[Server, Server]) -> None:
    """The working copy left to the default of a process started in the project: it holds the interpreter's
    environment. Refused before anything is touched: no owner changes."""
    venv = site / "work" / "mine" / "venv"
    (venv / "bin").mkdir(parents=True)
    owner = venv.stat().st_uid
    done = sandboxed(site, servers[0], "echo reached", read_only=[str(venv)])
    assert done.returncode == 125 and "reached" not in done.stdout and "holds" in done.stderr
    assert venv.stat().st_uid == owner and (site / "work" / "mine").stat().st_uid == owner
    hidden = sandboxed(site, servers[0], "echo reached", hide=[str(site / "work")], writable=[str(site / "work")])
    assert hidden.returncode == 125 and "reached" not in hidden.stdout


def test_a_link_left_where_a_copy_is_made_is_not_followed(site: Path, servers: tuple[Server, Server]) -> None:
    """The working copy reused with a hard-linked file in it and a link the agent left beside it: the launcher,
    root, copies the file before giving it away, and writes nothing through the link."""
    victim = site / "victim"
    victim.write_text("root's\n")
    victim.chmod(0o600)
    mine = site / "work" / "mine"
    os.link(site / "tasks" / "private" / "instances.jsonl", mine / "obj")
    (mine / "obj.tether-unlink").symlink_to(victim)
    done = sandboxed(site, servers[0], "echo ok")
    assert done.stdout == "ok\n" and victim.read_text() == "root's\n" and victim.stat().st_mode & 0o777 == 0o600


def test_one_working_copy_is_one_sandboxes_at_a_time(site: Path, servers: tuple[Server, Server]) -> None:
    gateway = servers[0]
    policy = Policy(workdir=str(site / "work" / "mine"), gateway=f"http://127.0.0.1:{gateway.port}")
    first = subprocess.Popen([sys.executable, "-m", "infra.sandbox", policy.model_dump_json(), "--", "sh", "-c",
                              "sleep 30"], cwd=site / "work" / "mine", env={"PATH": os.environ["PATH"]},
                             start_new_session=True)
    try:
        wait_held(site / "work" / "mine")
        second = sandboxed(site, gateway, "echo reached")
        assert second.returncode == 125 and "another running sandbox" in second.stderr
    finally:
        os.killpg(first.pid, signal.SIGTERM)  # as the runner stops a rollout
        first.wait(30)


def test_what_a_killed_launcher_leaves_the_next_one_removes(site: Path, servers: tuple[Server, Server]) -> None:
    gateway = servers[0]
    policy = Policy(workdir=str(site / "work" / "other"), gateway=f"http://127.0.0.1:{gateway.port}")
    launcher = subprocess.Popen([sys.executable, "-m", "infra.sandbox", policy.model_dump_json(), "--", "sh", "-c",
                                 "sleep 60"], cwd=site / "work" / "other",
                                env={"PATH": os.environ["PATH"], "TETHER_ROLLOUT_ID": "killed"},
                                start_new_session=True)
    wait_held(site / "work" / "other")
    time.sleep(1.0)  # the sandbox made, its cgroup among it
    os.killpg(launcher.pid, signal.SIGKILL)  # as the runner does past the grace period
    launcher.wait()
    left = list(Path(tempfile.gettempdir()).glob(f"tether-sandbox-{launcher.pid}-*"))
    assert left  # its private folder is there: nobody cleaned up
    time.sleep(0.5)  # the kernel reaps the sandbox's processes
    assert sandboxed(site, gateway, "true").returncode == 0
    assert not any(p.exists() for p in left)
    assert not [p for p in Path("/sys/fs/cgroup").rglob(f"tether-killed-{launcher.pid}")]
