"""Attacks from the agent's side: each runs inside a rollout's sandbox (`python -m infra.sandbox`), as a trained
agent's shell would, and each must fail and change nothing outside the working copy.

The sandbox is made as the controller makes it (the launcher, as this process's user; root in CI, so the agent
runs as nobody). The gateway is a stand-in HTTP server on loopback; a second server on another port stands for
everything else on the machine (the broker, another service).

Here: what the agent can reach (files, mounts, privileges, the network, processes, tokens, users)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra.sandbox.policy import Policy
from tests.sandbox.support import REPO, VENV_FILE, Server, digest, sandboxed, wait_held


def test_the_agent_works_in_its_copy_and_reaches_the_gateway(site: Path, servers: tuple[Server, Server]) -> None:
    gateway, _ = servers
    done = sandboxed(site, gateway, f"echo fixed >> code.py && id -u && {sys.executable} -c \"import urllib.request;"
                     f"print(urllib.request.urlopen('http://127.0.0.1:{gateway.port}/').read().decode())\"")
    assert done.returncode == 0, done.stderr
    uid, answer = done.stdout.split()
    assert answer == "gateway" and (uid != "0" or os.geteuid() != 0)
    assert (site / "work" / "mine" / "code.py").read_text() == "# mine\nfixed\n"


@pytest.mark.parametrize("target", ["grader", "venv", "interpreter", "home", "maven", "tasks", "other rollout",
                                    "system"])
def test_writing_outside_the_working_copy_fails_and_changes_nothing(
        site: Path, servers: tuple[Server, Server], target: str) -> None:
    home = Path(os.path.expanduser("~"))
    path = {"grader": REPO / "swe" / "grade.py", "venv": VENV_FILE,
            "interpreter": Path(os.path.realpath(sys.executable)), "home": home / ".bashrc",
            "maven": home / ".m2" / "settings.xml", "tasks": site / "tasks" / "private" / "instances.jsonl",
            "other rollout": site / "work" / "other" / "code.py", "system": Path("/etc/hostname")}[target]
    before = digest(path) if path.exists() else None
    done = sandboxed(site, servers[0], f"echo 'REWARD = 1.0' >> '{path}' || exit 3; mkdir -p '{path.parent}' && "
                                       f"echo 'REWARD = 1.0' >> '{path}' && exit 0; exit 3")
    assert done.returncode == 3, (done.stdout, done.stderr)
    assert (digest(path) if path.exists() else None) == before


def test_the_tasks_other_copies_and_tether_are_not_there_to_read(site: Path, servers: tuple[Server, Server]) -> None:
    done = sandboxed(site, servers[0], f"echo tasks: $(ls -A '{site}/tasks'); echo work: $(ls -A '{site}/work'); "
                                       f"echo tether: $(ls -A '{REPO}' 2>&1); "
                                       "echo m2: $(ls -A ~root/.m2 2>/dev/null | wc -l); "
                                       f"cat '{site}/tasks/private/instances.jsonl' '{REPO}/swe/grade.py' 2>&1 | "
                                       "grep -c -e gold -e REWARD")
    venv = [".venv"] if Path(sys.prefix).parent == REPO else []  # the interpreter's own environment, read-only
    assert done.stdout.splitlines() == ["tasks:", "work: mine", f"tether: {' '.join(venv)}".rstrip(), "m2: 0", "0"]


def test_mounts_cannot_be_undone_nor_privileges_regained(site: Path, servers: tuple[Server, Server]) -> None:
    script = (f"umount '{site}/tasks' 2>/dev/null; umount -l / 2>/dev/null; "
              "mount -o remount,rw /usr 2>/dev/null; unshare -Ur true 2>/dev/null && echo USERNS; "
              "su -c id 2>/dev/null && echo SU; "
              "grep -E '^Cap(Prm|Eff|Bnd)' /proc/self/status; ls /proc/1/root/ 2>/dev/null | head -1; "
              f"ls '{site}/tasks'")
    done = sandboxed(site, servers[0], script)
    lines = done.stdout.split("\n")
    assert "USERNS" not in lines and "SU" not in lines, done.stdout
    assert [line.split()[1] for line in lines if line.startswith("Cap")] == ["0000000000000000"] * 3
    assert lines[3:] == [""], done.stdout  # /proc/1/root unreadable, the tasks folder still empty


def test_the_network_is_the_gateway_alone(site: Path, servers: tuple[Server, Server]) -> None:
    gateway, other = servers
    probe = ("import socket\n"
             f"for host, port in [('127.0.0.1', {other.port}), ('127.0.0.1', {gateway.port}), ('10.255.255.1', 80),"
             " ('::1', 80)]:\n"
             "    s = socket.socket(socket.AF_INET6 if ':' in host else socket.AF_INET)\n"
             "    s.settimeout(2)\n"
             "    print(host, port, s.connect_ex((host, port)) == 0)\n")
    (site / "work" / "mine" / "probe.py").write_text(probe)
    done = sandboxed(site, gateway, f"{sys.executable} probe.py")
    reached = {line.split()[1]: line.split()[2] for line in done.stdout.splitlines()}
    assert reached == {str(other.port): "False", str(gateway.port): "True", "80": "False"}, done.stdout + done.stderr


def test_no_process_outside_the_sandbox_can_be_seen_or_signalled(site: Path, servers: tuple[Server, Server]) -> None:
    outside = subprocess.Popen(["sleep", "60"])  # the controller, the gateway, the broker, another rollout
    try:
        done = sandboxed(site, servers[0], f"kill -9 {outside.pid} 1 2>/dev/null; test -e /proc/{outside.pid} && "
                                           "echo SEEN; grep -l -a TOKEN_OF_OTHER /proc/*/environ 2>/dev/null; true",
                         env={"TETHER_API_KEY": "mine"})
        assert "SEEN" not in done.stdout and "environ" not in done.stdout
        assert outside.poll() is None  # still running
    finally:
        outside.kill()
        outside.wait()


def test_another_rollouts_token_is_out_of_reach(site: Path, servers: tuple[Server, Server]) -> None:
    """Two rollouts at once: the second reads every process it can see, and every folder where a token could be
    written (the system's and the interpreter's are read-only and installed), for the first's token."""
    gateway = servers[0]
    policy = Policy(workdir=str(site / "work" / "other"), gateway=f"http://127.0.0.1:{gateway.port}")
    first = subprocess.Popen([sys.executable, "-m", "infra.sandbox", policy.model_dump_json(), "--", "sh", "-c",
                              "sleep 30"], cwd=site / "work" / "other", start_new_session=True,
                             env={"PATH": os.environ["PATH"], "OPENAI_API_KEY": "tr2.first-rollouts-token"})
    try:
        wait_held(site / "work" / "other")
        time.sleep(0.5)  # its harness started
        (site / "work" / "mine" / "pattern").write_text("first-rollouts-token\n")  # not in any command line
        done = sandboxed(site, gateway, "cat /proc/*/environ /proc/*/cmdline 2>/dev/null | tr '\\0' '\\n' | "
                                        "grep -c -f pattern; grep -rs -f pattern -l /tmp /var/tmp /dev/shm /home /run "
                                        f"/etc {site} | grep -v pattern | head -3; true",
                         env={"OPENAI_API_KEY": "tr2.mine"})
        assert done.stdout.split() == ["0"], done.stdout
    finally:
        os.killpg(first.pid, signal.SIGTERM)
        first.wait(30)


def test_two_sandboxes_at_once_are_two_users(site: Path, servers: tuple[Server, Server]) -> None:
    if os.geteuid() != 0:
        pytest.skip("only root hands out users; as another user every sandbox is that user")
    gateway = servers[0]
    policy = Policy(workdir=str(site / "work" / "other"), gateway=f"http://127.0.0.1:{gateway.port}")
    first = subprocess.Popen([sys.executable, "-m", "infra.sandbox", policy.model_dump_json(), "--", "sh", "-c",
                              "id -u > uid; sleep 5"], cwd=site / "work" / "other",
                             env={"PATH": os.environ["PATH"], "TMPDIR": str(site)})  # the users' locks are not there
    try:
        time.sleep(1.5)
        done = sandboxed(site, gateway, "id -u")
    finally:
        first.wait(30)
    assert done.stdout.split()[0] != (site / "work" / "other" / "uid").read_text().strip()
