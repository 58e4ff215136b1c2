"""Attacks from the agent's side: each runs inside a rollout's sandbox (`python -m infra.sandbox`), as a trained
agent's shell would, and each must fail and change nothing outside the working copy.

The sandbox is made as the controller makes it (the launcher, as this process's user; root in CI, so the agent
runs as nobody). The gateway is a stand-in HTTP server on loopback; a second server on another port stands for
everything else on the machine (the broker, another service)."""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import http.server
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller import harness_env
from controller.config import Harness, Sandbox
from controller.main import process_specs
from controller.runners.base import ProcessSpec, Spec
from controller.runners.local import LocalRunner
from infra.sandbox import cgroups
from infra.sandbox.errors import PolicyError
from infra.sandbox.policy import UIDS, Layout, Limits, Policy, gateway_of, inside_url, plan, visibility

REPO = Path(__file__).resolve().parent.parent
VENV_FILE = Path(sys.prefix) / "pyvenv.cfg"


@pytest.fixture(scope="module", autouse=True)
def _bubblewrap() -> None:
    if shutil.which("bwrap") is None:
        pytest.fail("bubblewrap is not installed: `make setup` installs it (Debian: apt-get install bubblewrap)")


class Server:
    """An HTTP server on loopback answering every GET with its name."""

    def __init__(self, name: str) -> None:
        body = name.encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[Server, Server]]:
    gateway, other = Server("gateway"), Server("elsewhere")
    yield gateway, other
    gateway.close()
    other.close()


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """A run's folder as the swe example lays it out: tasks (private), two rollouts' copies."""
    (tmp_path / "tasks" / "private").mkdir(parents=True)
    (tmp_path / "tasks" / "private" / "instances.jsonl").write_text("the gold patch\n")
    for rollout in ("mine", "other"):
        (tmp_path / "work" / rollout).mkdir(parents=True)
        (tmp_path / "work" / rollout / "code.py").write_text(f"# {rollout}\n")
    return tmp_path


def sandboxed(site: Path, gateway: Server, script: str, *, env: dict[str, str] | None = None,
              timeout: float = 120, **policy: object) -> subprocess.CompletedProcess[str]:
    """`sh -c script` as the agent, in work/mine."""
    workdir = site / "work" / "mine"
    spec = Policy.model_validate({"workdir": str(workdir), "gateway": f"http://127.0.0.1:{gateway.port}",
                                  "hide": [str(site / "tasks")], **policy})
    environ = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8", **(env or {})}
    return subprocess.run([sys.executable, "-m", "infra.sandbox", spec.model_dump_json(), "--", "sh", "-c", script],
                          cwd=workdir, env=environ, capture_output=True, text=True, timeout=timeout)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


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


def test_the_controller_gives_a_sandboxed_harness_none_of_its_secrets(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TETHER_CONTROLLER_GATEWAY_SECRET", "TETHER_GATEWAY_ADMIN_KEY", "TETHER_BUS_PASSWORD", "AWS_TOKEN"):
        monkeypatch.setenv(name, "secret")
    base = Spec(rollout_id="r.t.r0.a0", run_id="r", task_id="t", attempt=0, env={"OPENAI_API_KEY": "mine"},
                log_path=tmp_path / "r.log")
    harness = Harness(command=["agent", "{rollout_id}"], workdir=tmp_path, setup=["mkdir", "work/{rollout_id}"])
    spec = process_specs(harness, Sandbox(workdir="work/{rollout_id}"), "http://127.0.0.1:8000")(
        base, lambda obj: json.loads(json.dumps(obj).replace("{rollout_id}", base.rollout_id)))
    assert spec.env["OPENAI_API_KEY"] == "mine" and not {k for k in spec.env if "secret" in spec.env[k]}
    assert spec.setup == ["mkdir", "work/r.t.r0.a0"] and spec.argv[-2:] == ["agent", "r.t.r0.a0"]
    policy = Policy.model_validate_json(spec.argv[3])
    assert policy.workdir == str(tmp_path / "work" / "r.t.r0.a0")
    loose = process_specs(harness, Sandbox(enabled=False))(base, lambda obj: obj)
    assert "AWS_TOKEN" in loose.env and not {k for k in loose.env if k.startswith(harness_env.SECRET_PREFIXES)}


def test_a_gateway_the_sandbox_cannot_stand_for_is_refused() -> None:
    assert gateway_of("http://gateway.tether:8000").name == "gateway.tether"
    assert gateway_of("https://[::1]/v1").listen == ("::1",) and gateway_of("https://[::1]/v1").port == 443
    for url in ("http://10.0.0.5:8000", "ftp://127.0.0.1", "http://:80"):
        with pytest.raises(PolicyError):
            gateway_of(url)


# -- the plan, held to its rules: writable over hidden over read-only, and nothing unnamed -------------------

segment = st.sampled_from(["a", "b", "c", "work", "tasks"])
paths = st.lists(segment, min_size=1, max_size=4).map(lambda parts: "/data/" + "/".join(parts))


@given(read_only=st.lists(paths, max_size=4), hide=st.lists(paths, max_size=3),
       writable=st.lists(paths, max_size=3), workdir=paths, probe=paths)
def test_a_path_is_seen_as_the_policy_says(read_only: list[str], hide: list[str], writable: list[str],
                                          workdir: str, probe: str) -> None:
    policy = Policy(workdir=workdir, read_only=read_only, hide=hide, writable=writable, gateway="http://127.0.0.1:1",
                    limits=Limits())

    def under(p: str, roots: list[str]) -> bool:
        return any(p == r or p.startswith(r + "/") for r in roots)

    layout = Layout(system=(("/usr", None), ("/bin", "usr/bin")), interpreter=("/opt/python",))
    mine = [workdir, *writable]
    try:
        mounts = plan(policy, layout)
    except PolicyError:  # refused only where a writable folder holds another, or a path the agent must only read
        assert any(under(a, [b]) for a in mine for b in mine if a is not b) or \
            any(under(p, mine) for p in [*read_only, *hide])
        return
    seen = visibility(mounts, probe)
    if under(probe, [workdir, *writable]):
        assert seen == "writable"
    elif under(probe, hide):
        assert seen == "empty"
    elif under(probe, read_only):
        assert seen == "read-only"
    else:
        assert seen == "absent"
    assert visibility(mounts, "/opt/python/lib") == "read-only" and visibility(mounts, "/root") == "absent"


def test_a_gateway_on_a_privileged_port_is_served_inside_on_another(site: Path, tmp_path: Path) -> None:
    """An unprivileged user cannot listen on port 80: the harness is told the gateway's URL with the port the
    sandbox serves it on, and its calls reach the real one."""
    assert inside_url("http://gateway.tether/v1") == "http://gateway.tether:10080/v1"
    assert inside_url("https://u@[::1]:443/v1") == "https://u@[::1]:10443/v1"
    assert inside_url("http://127.0.0.1:8000") == "http://127.0.0.1:8000"
    base = Spec(rollout_id="r", run_id="r", task_id="t", attempt=0, log_path=tmp_path / "log",
                env={"OPENAI_BASE_URL": "http://gateway.tether/v1", "TETHER_REWARD_URL": "http://gateway.tether/r"})
    spec = process_specs(Harness(command=["a"], workdir=tmp_path), Sandbox(workdir="."), "http://gateway.tether")(
        base, lambda obj: obj)
    assert spec.env["OPENAI_BASE_URL"] == "http://gateway.tether:10080/v1"
    assert spec.env["TETHER_REWARD_URL"] == "http://gateway.tether:10080/r"


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


def wait_held(workdir: Path, timeout_s: float = 30) -> None:
    """Until a launcher holds the working copy's lock (it does from before the sandbox is made to its end)."""
    deadline = time.monotonic() + timeout_s
    handle = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        while time.monotonic() < deadline:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(handle, fcntl.LOCK_UN)
            except BlockingIOError:
                return
            time.sleep(0.02)
    finally:
        os.close(handle)
    raise AssertionError(f"no launcher took {workdir} within {timeout_s} s")


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


def _sandboxed_spec(tmp_path: Path, gateway: Server, code: str) -> ProcessSpec:
    """A rollout's spec as the controller makes it for a sandboxed Python harness."""
    rid = f"r.t.r0.a{uuid.uuid4().hex[:6]}"
    (tmp_path / "work" / rid).mkdir(parents=True)
    base = Spec(rollout_id=rid, run_id="r", task_id="t", attempt=0, log_path=tmp_path / "logs" / f"{rid}.log",
                env={"TETHER_ROLLOUT_ID": rid})
    harness = Harness(command=[sys.executable, "-c", code], workdir=tmp_path)
    return process_specs(harness, Sandbox(workdir="work/{rollout_id}"), f"http://127.0.0.1:{gateway.port}")(
        base, lambda obj: json.loads(json.dumps(obj).replace("{rollout_id}", rid)))


async def test_a_restarted_controller_finds_a_sandboxed_rollout_and_its_exit(
        tmp_path: Path, servers: tuple[Server, Server]) -> None:
    spec = _sandboxed_spec(tmp_path, servers[0], "import sys, time; open('out', 'w').write('x'); time.sleep(2); "
                                                 "sys.exit(5)")
    first = LocalRunner(grace_s=1.0)
    await first.start(spec)
    await first.close()  # the controller that started it is gone
    second = LocalRunner(grace_s=1.0)
    try:
        assert await second.attach(spec)
        outcome = await second.wait(spec, 60)
    finally:
        await second.close()
    assert (outcome.status, outcome.exit_code) == ("exited", 5), spec.log_path.read_text()
    assert (tmp_path / "work" / spec.rollout_id / "out").read_text() == "x"  # copied back


async def test_a_sandboxed_rollout_past_its_time_is_stopped_whole(tmp_path: Path,
                                                                  servers: tuple[Server, Server]) -> None:
    """A harness that ignores SIGTERM and leaves a process of its own: the runner's SIGKILL after the grace period
    ends the sandbox and everything in it."""
    code = ("import os, signal, subprocess, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "subprocess.Popen(['sleep', '300'], start_new_session=True); open('ready', 'w').close(); time.sleep(300)")
    spec = _sandboxed_spec(tmp_path, servers[0], code)
    runner = LocalRunner(grace_s=1.0)
    try:
        await runner.start(spec)
        assert await _until(lambda: len(_sandbox_processes()) >= 3)  # the harness, its sleep, inside.py at least
        outcome = await runner.wait(spec, 3)
    finally:
        await runner.close()
    assert outcome.status == "timeout"
    assert await _until(lambda: not _sandbox_processes()), _sandbox_processes()


async def _until(condition: Callable[[], bool], timeout_s: float = 15) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():  # processes of other users: nothing to wait on but polling
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


def _sandbox_processes() -> list[int]:
    """Processes of the users the launcher hands out (none of the machine's own)."""
    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            uid = int(next(line for line in status.read_text().splitlines() if line.startswith("Uid:")).split()[1])
        except (OSError, StopIteration, ValueError):
            continue
        if Policy.model_fields["uid"].default <= uid < Policy.model_fields["uid"].default + UIDS:
            found.append(int(status.parent.name))
    return found
