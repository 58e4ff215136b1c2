"""Format, start, probe and stop the local Kafka (one KRaft node, or a cluster of them), found again by PID files.

`up`, `down` and `status` work from any later process. Readiness means every broker is registered in the
cluster's metadata, answered by a real request with the cluster id we formatted, not that a port opened.
Starting also provisions what Tether needs: the topic catalogue, replicated as the cluster allows, and on a
secured cluster the services' ACLs. Start and stop hold a lock on the state folder, so two `tether kafka up`
at once start one cluster. A node that was killed is started again, on its intact disk, by the next start.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import fcntl
import json
import logging
import re
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from infra.errors import BrokerBusy, BrokerStartFailed, PortInUse
from infra.kafka import jars, provision, tls
from infra.kafka.acls import ADMIN, USERS
from infra.kafka.config import server_properties
from infra.kafka.settings import BrokerSettings
from infra.kafka.users import Users
from infra.processes import group_alive, reap, signal_group, spawn, stop_group, tail
from schemas.settings import BusSettings

LOG4J = Path(__file__).parent / "log4j2.properties"
T = TypeVar("T")
QUORUM_LOST_GRACE_S = 3.0
FENCE_WAIT_S = 30.0  # past the brokers' session timeout (9 s), with room for a loaded machine
RECORDED = ("brokers", "security", "host", "port", "controller_port", "internal_port")  # in cluster.json


def new_cluster_id() -> str:
    """A random Kafka Uuid in its base64 form, never starting with '-' (the storage tool's argument parser would
    read it as an option; Kafka's own Uuid.randomUuid() redraws for the same reason: 1 id in 64 did)."""
    while True:
        candidate = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not candidate.startswith("-"):
            return candidate


@dataclass(frozen=True)
class BrokerStatus:
    running: bool
    ready: bool
    pid: int | None
    pids: dict[int, int | None]
    bootstrap: str
    security: str
    cluster_id: str | None
    version: str
    jars_fetched: bool
    state_dir: Path


@dataclass(frozen=True)
class Node:
    """One KRaft node's files: its config, data, log and PID file."""

    id: int
    folder: Path

    @property
    def data_dir(self) -> Path:
        return self.folder / "data"

    @property
    def config_file(self) -> Path:
        return self.folder / "server.properties"

    @property
    def pid_file(self) -> Path:
        return self.folder / "broker.pid"

    @property
    def log_file(self) -> Path:
        return self.folder / "broker.log"

    def cluster_id(self) -> str | None:
        try:
            match = re.search(r"^cluster\.id=(\S+)$", (self.data_dir / "meta.properties").read_text(), re.M)
        except OSError:
            return None
        return match.group(1) if match else None

    def pid(self) -> int | None:
        """The live node's PID from its PID file; a stale file (or a reused PID) is removed."""
        try:
            pid = int(self.pid_file.read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            self.pid_file.unlink(missing_ok=True)
            return None
        if b"kafka.Kafka" not in cmdline or str(self.config_file.resolve()).encode() not in cmdline:
            self.pid_file.unlink(missing_ok=True)
            return None
        return pid


class KafkaBroker:
    """The local Kafka: `settings.brokers` KRaft nodes (one by default) under one state folder."""

    def __init__(self, settings: BrokerSettings) -> None:
        self.settings = settings = _as_recorded(settings)
        self.libs_dir = settings.cache_dir / settings.version / "libs"
        self.state_dir = settings.state_dir
        self.nodes = [Node(node, self.state_dir / f"node-{node}") for node in settings.node_ids]
        self.certs = tls.Certificates(self.state_dir / "tls")
        self.users = Users(self.state_dir / "users")
        self.shape_file = self.state_dir / "cluster.json"

    @property
    def bootstrap(self) -> str:
        return self.settings.bootstrap

    def fetch(self) -> Path:
        return jars.fetch(self.libs_dir, self.settings.version)

    def cluster_id(self) -> str | None:
        return self.nodes[0].cluster_id()

    def pids(self) -> dict[int, int | None]:
        return {node.id: node.pid() for node in self.nodes}

    def pid(self) -> int | None:
        """The PID of the first node that runs, None if none does."""
        return next((pid for pid in self.pids().values() if pid is not None), None)

    def client_settings(self, user: str = ADMIN, **overrides: Any) -> BusSettings:
        """How a client reaches this cluster as `user` (a service's name from the ACL table, or admin)."""
        fields: dict[str, Any] = {"bootstrap_servers": self.bootstrap}
        if self.settings.secured:
            fields |= {"security_protocol": "SASL_SSL", "username": user, "password": self.users.password(user),
                       "ca_file": self.certs.ca_cert.resolve()}
        return BusSettings(**(fields | overrides))

    def client_env(self, user: str = ADMIN) -> dict[str, str]:
        """The TETHER_BUS_* variables of `client_settings(user)`, for a service started as its own process."""
        bus = self.client_settings(user)
        env = {"BOOTSTRAP_SERVERS": bus.bootstrap_servers, "SECURITY_PROTOCOL": bus.security_protocol}
        if bus.sasl_login is not None:
            env |= {"SASL_MECHANISM": bus.sasl_mechanism, "USERNAME": bus.sasl_login[0],
                    "PASSWORD": bus.sasl_login[1], "CA_FILE": str(bus.ca_file)}
        return {f"TETHER_BUS_{name}": value for name, value in env.items()}

    def start(self) -> int:
        """Start every node that does not run, wait until the whole cluster answers, provision it; the PID of
        the first node."""
        with self._locked():
            stopped = [node for node in self.nodes if node.pid() is None]
            if stopped:
                self._await_fenced(stopped)
            started = self._start(stopped) if stopped else {}
            try:
                self._wait_ready(started)
            except BaseException:
                self._stop(True, stopped)  # never leave a half-started node behind
                raise
            asyncio_run(provision.provision(self.client_settings(client_id="tether-kafka-up"),
                                            acls=self.settings.secured))
            pid = self.pid()
            if pid is None:
                raise BrokerStartFailed(f"Kafka stopped right after it started; see {self.nodes[0].log_file}")
            return pid

    def stop(self, force: bool = False, node: int | None = None) -> bool:
        """Stop every node (or only `node`): SIGTERM (SIGKILL when forced) to all at once, escalating after
        stop_timeout_s; False if none was running."""
        with self._locked():
            legacy = Node(1, self.state_dir)  # a broker started before nodes had folders of their own
            everything = node is None and legacy.pid() is not None
            stopped = self._stop(force, [legacy]) if everything else False
            return self._stop(force, [n for n in self.nodes if node is None or n.id == node]) or stopped

    def probe(self, timeout_s: float = 5.0) -> str | None:
        """The cluster id, once every node is a registered broker; None if the cluster does not answer so.
        Safe inside an event loop."""
        cluster = self._describe(timeout_s)
        return str(cluster["cluster_id"]) if cluster and len(cluster["brokers"]) == len(self.nodes) else None

    def _describe(self, timeout_s: float) -> dict[str, Any] | None:
        """The cluster as the admin API reports it (id, registered brokers); None if it does not answer."""
        try:
            settings = self.client_settings(client_id="tether-kafka-probe", request_timeout_ms=int(timeout_s * 1000))
        except BrokerStartFailed:
            return None  # secured, and never started: no users yet
        quiet = logging.getLogger("aiokafka")
        level = quiet.level
        quiet.setLevel(logging.CRITICAL)  # connection refusals are expected while it boots
        try:
            return asyncio_run(asyncio.wait_for(provision.describe_cluster(settings), timeout_s))
        except Exception:  # any failure to answer means "not ready", never a crash
            return None
        finally:
            quiet.setLevel(level)

    def _await_fenced(self, nodes: list[Node]) -> None:
        """A node that crashed stays registered until its session times out (9 s); started before that, it is
        refused (DuplicateBrokerRegistration) while the cluster still lists it, so wait until the others let it
        go. Only a partial restart waits: a cluster started whole lists nobody."""
        if len(nodes) == len(self.nodes):
            return
        ids, deadline = {n.id for n in nodes}, time.monotonic() + FENCE_WAIT_S
        while time.monotonic() < deadline:
            cluster = self._describe(timeout_s=5.0)  # None: the client asked the dead node; ask again
            if cluster is not None and not ids & {int(b["node_id"]) for b in cluster["brokers"]}:
                return
            time.sleep(0.5)

    def status(self) -> BrokerStatus:
        pids = self.pids()
        running = all(pid is not None for pid in pids.values())
        return BrokerStatus(
            running=running,
            ready=running and self.probe() == self.cluster_id(),
            pid=self.pid(),
            pids=pids,
            bootstrap=self.bootstrap,
            security=self.settings.security,
            cluster_id=self.cluster_id(),
            version=self.settings.version,
            jars_fetched=jars.fetched(self.libs_dir),
            state_dir=self.state_dir,
        )

    def wipe(self) -> None:
        """Delete every node's data, the certificates and the users: the next start makes a new cluster."""
        with self._locked():
            if self.pid() is not None:
                raise BrokerBusy("Kafka is running; stop it (tether kafka down) before wiping its data")
            legacy = self.state_dir / "data"  # the single broker's data before nodes had folders of their own
            for folder in (*self.state_dir.glob("node-*"), self.certs.folder, self.users.folder, legacy):
                shutil.rmtree(folder, ignore_errors=True)
            self.shape_file.unlink(missing_ok=True)

    # -- internals ---------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with (self.state_dir / ".lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def _start(self, nodes: list[Node]) -> dict[int, subprocess.Popen[bytes]]:
        java = jars.find_java()
        self.fetch()
        self._check_shape()
        for node in nodes:
            for base in self._ports():
                _require_free(self.settings.host, self.settings.node_port(node.id, base))
        if self.settings.secured:
            self.certs.ensure(self.settings.node_ids, (self.settings.host,))
            self.users.ensure(USERS)
        self._format(java, nodes)
        started: dict[int, subprocess.Popen[bytes]] = {}
        for node in nodes:
            started[node.id] = spawn(self._java_cmd(java, "kafka.Kafka", str(node.config_file.resolve())),
                                     node.log_file)
            node.pid_file.write_text(f"{started[node.id].pid}\n")
        self.shape_file.write_text(json.dumps(self.settings.model_dump(mode="json", include=set(RECORDED))))
        return started

    def _ports(self) -> tuple[int, ...]:
        s = self.settings
        return (s.port, s.controller_port, s.internal_port) if s.secured else (s.port, s.controller_port)

    def _check_shape(self) -> None:
        """A state folder holds one cluster: starting it as another shape would mix nodes and credentials."""
        if not self.shape_file.exists() or not any(node.cluster_id() for node in self.nodes):
            return
        shape = json.loads(self.shape_file.read_text())
        if (shape.get("brokers"), shape.get("security")) != (self.settings.brokers, self.settings.security):
            raise BrokerStartFailed(
                f"{self.state_dir} holds a cluster of {shape['brokers']} {shape['security']} broker(s), not "
                f"{self.settings.brokers} {self.settings.security}; stop and wipe it (tether kafka down; tether "
                "kafka wipe) or set TETHER_KAFKA_STATE_DIR to another folder")

    def _java_cmd(self, java: str, main: str, *args: str) -> list[str]:
        return [
            java, "-Xms128m", f"-Xmx{self.settings.heap}", "-XX:MaxMetaspaceSize=256m", "-XX:+UseSerialGC",
            "-Djava.awt.headless=true", f"-Dlog4j2.configurationFile={LOG4J}",
            "-cp", f"{self.libs_dir.resolve()}/*", main, *args,
        ]

    def _format(self, java: str, nodes: list[Node]) -> None:
        """Write each node's config; format the storage of those not formatted yet, all with one cluster id (and,
        secured, every service's SCRAM user), in parallel."""
        cluster_id = next((found for n in self.nodes if (found := n.cluster_id())), None) or new_cluster_id()
        users = self.users.format_args(USERS) if self.settings.secured else []
        certs = self.certs if self.settings.secured else None
        formatting: list[tuple[Node, subprocess.Popen[str]]] = []
        for node in nodes:
            node.folder.mkdir(parents=True, exist_ok=True)
            node.config_file.write_text(server_properties(self.settings, node.id, node.data_dir, certs))
            if node.cluster_id() is None:
                cmd = self._java_cmd(java, "kafka.tools.StorageTool", "format", "-t", cluster_id,
                                     "-c", str(node.config_file), *users)
                formatting.append((node, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                          text=True)))
        for node, process in formatting:
            out, _ = process.communicate()
            if process.returncode != 0:
                raise BrokerStartFailed(f"formatting {node.data_dir} failed: {out.strip()[-400:]}")

    def _wait_ready(self, started: dict[int, subprocess.Popen[bytes]]) -> None:
        """Until the cluster answers with every broker; a node that exits meanwhile is an error at once. The
        nodes just started are watched through their process handles: right after exec, /proc/PID/cmdline
        may still read empty."""
        deadline = time.monotonic() + self.settings.start_timeout_s
        expected = self.cluster_id()
        while time.monotonic() < deadline:
            for node in self.nodes:
                process = started.get(node.id)
                if (process.poll() is not None) if process is not None else node.pid() is None:
                    raise BrokerStartFailed(f"Kafka node {node.id} exited during start-up; last log lines: "
                                            f"{tail(node.log_file)}")
            found = self.probe()
            if found is not None:
                if found != expected:
                    raise BrokerStartFailed(f"{self.bootstrap} answers as cluster {found}, not ours ({expected})")
                return
            time.sleep(0.5)
        raise BrokerStartFailed(
            f"Kafka ({len(self.nodes)} node(s)) did not answer with every broker registered within "
            f"{self.settings.start_timeout_s:.0f}s; see {', '.join(str(n.log_file) for n in self.nodes)}"
        )

    def _stop(self, force: bool, nodes: list[Node]) -> bool:
        """Signal all at once, then wait. A node's broker shuts down only once the quorum approves, so nodes
        left without a majority of running controllers would wait forever: they get QUORUM_LOST_GRACE_S, then
        SIGKILL (their logs are recovered at the next start; nothing acknowledged is lost)."""
        running = {node.id: pid for node in nodes if (pid := node.pid()) is not None}
        first = signal.SIGKILL if force else signal.SIGTERM
        for pid in running.values():
            signal_group(pid, first)
        others = [pid for node in self.nodes if node.id not in running and (pid := node.pid()) is not None]
        majority = len(self.nodes) // 2 + 1
        deadline = time.monotonic() + self.settings.stop_timeout_s
        quorum_lost: float | None = None
        while (left := [pid for pid in running.values() if group_alive(pid)]) and time.monotonic() < deadline:
            if len(left) + len([pid for pid in others if group_alive(pid)]) < majority:
                quorum_lost = quorum_lost or time.monotonic()
                if time.monotonic() - quorum_lost > QUORUM_LOST_GRACE_S:
                    break
            time.sleep(0.2)
        for node in nodes:
            if node.id in running and group_alive(running[node.id]):  # a vanished group's number may be reused
                stop_group(running[node.id], 0, first=signal.SIGKILL, poll_s=0.1)  # reaps; kills what is left
            elif node.id in running:
                reap(running[node.id])
            node.pid_file.unlink(missing_ok=True)
        return bool(running)


def _as_recorded(settings: BrokerSettings) -> BrokerSettings:
    """The shape and ports of the cluster last started from the state folder, where not set explicitly: a later
    `tether kafka down` or `status` (or `tether up`) finds every node of a `tether kafka up --brokers 3`."""
    try:
        shape = json.loads((settings.state_dir / "cluster.json").read_text())
    except (OSError, ValueError):
        return settings
    unset = {key: shape[key] for key in RECORDED if key in shape and key not in settings.model_fields_set}
    return settings.model_copy(update=unset) if unset else settings


def asyncio_run(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` on a loop of its own in a worker thread, so that callers inside an event loop can call it."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def _require_free(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise PortInUse(
                f"port {port} on {host} is taken by another process; set TETHER_KAFKA_PORT / "
                "TETHER_KAFKA_CONTROLLER_PORT / TETHER_KAFKA_INTERNAL_PORT to free ones"
            ) from exc
