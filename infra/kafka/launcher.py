"""Fetch, format, start, probe and stop a single-node KRaft broker.

The broker is a plain JVM process found again through its PID file, so `up`,
`down` and `status` work from any later process; readiness means the broker
answered a real metadata request with the cluster id we formatted, not that a
port opened.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from aiokafka.admin import AIOKafkaAdminClient

from infra.errors import BrokerBusy, BrokerStartFailed, FetchFailed, PortInUse, PrerequisiteMissing
from infra.kafka.settings import BrokerSettings

HERE = Path(__file__).parent
MIN_JAVA = 17


@dataclass(frozen=True)
class BrokerStatus:
    running: bool
    ready: bool
    pid: int | None
    bootstrap: str
    cluster_id: str | None
    version: str
    jars_fetched: bool
    state_dir: Path


def server_properties(settings: BrokerSettings, data_dir: Path) -> str:
    """The broker's config: one node, both roles, sized for a small shared machine."""
    host, port, cport = settings.host, settings.port, settings.controller_port
    return "\n".join([
        "process.roles=broker,controller",
        "node.id=1",
        f"controller.quorum.voters=1@{host}:{cport}",
        f"listeners=PLAINTEXT://{host}:{port},CONTROLLER://{host}:{cport}",
        f"advertised.listeners=PLAINTEXT://{host}:{port}",
        "controller.listener.names=CONTROLLER",
        "inter.broker.listener.name=PLAINTEXT",
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        f"log.dirs={data_dir.resolve()}",
        # Topics come from the catalogue (schemas.admin), never from a typo in a producer.
        "auto.create.topics.enable=false",
        "num.partitions=1",
        "default.replication.factor=1",
        "min.insync.replicas=1",
        "offsets.topic.replication.factor=1",
        "offsets.topic.num.partitions=8",
        "transaction.state.log.replication.factor=1",
        "transaction.state.log.min.isr=1",
        "transaction.state.log.num.partitions=8",
        "share.coordinator.state.topic.replication.factor=1",
        "share.coordinator.state.topic.min.isr=1",
        "group.initial.rebalance.delay.ms=0",
        f"message.max.bytes={16 * 1024 * 1024}",
        "num.network.threads=2",
        "num.io.threads=4",
        "background.threads=2",
        "",
    ])


class KafkaBroker:
    def __init__(self, settings: BrokerSettings) -> None:
        self.settings = settings
        self.libs_dir = settings.cache_dir / settings.version / "libs"
        self.state_dir = settings.state_dir
        self.data_dir = self.state_dir / "data"
        self.config_file = self.state_dir / "server.properties"
        self.pid_file = self.state_dir / "broker.pid"
        self.log_file = self.state_dir / "broker.log"

    @property
    def bootstrap(self) -> str:
        return self.settings.bootstrap

    # -- prerequisites and jars ------------------------------------------------

    def check_java(self) -> str:
        java = shutil.which("java")
        if java is None:
            raise PrerequisiteMissing(f"Java {MIN_JAVA}+ is required to run Kafka, and `java` is not on PATH.")
        out = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
        match = re.search(r'version "(\d+)(?:\.(\d+))?', out)
        major = int(match.group(1)) if match else 0
        if major == 1 and match and match.group(2):  # "1.8.0" is Java 8
            major = int(match.group(2))
        if major < MIN_JAVA:
            found = major or "unknown"
            raise PrerequisiteMissing(f"Java {MIN_JAVA}+ is required to run Kafka, found Java {found} at {java}.")
        return java

    def jars_fetched(self) -> bool:
        return (self.libs_dir / ".complete").exists()

    def fetch(self) -> Path:
        """Download the broker and its runtime dependencies with Maven, once per version."""
        if self.jars_fetched():
            return self.libs_dir
        mvn = shutil.which("mvn")
        if mvn is None:
            raise PrerequisiteMissing("Maven is required to fetch the Kafka broker, and `mvn` is not on PATH.")
        partial = self.libs_dir.with_name("libs.partial")
        shutil.rmtree(partial, ignore_errors=True)
        cmd = [mvn, "-q", "-B", "-f", str(HERE / "pom.xml"), "dependency:copy-dependencies",
               f"-DoutputDirectory={partial.resolve()}", f"-Dkafka.version={self.settings.version}"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0 or not any(partial.glob("kafka_2.13-*.jar")):
            tail = " | ".join((done.stdout + done.stderr).strip().splitlines()[-5:])
            raise FetchFailed(f"Maven could not fetch Kafka {self.settings.version}: {tail}")
        shutil.rmtree(self.libs_dir, ignore_errors=True)
        partial.rename(self.libs_dir)
        (self.libs_dir / ".complete").touch()
        return self.libs_dir

    def _java_cmd(self, java: str, main: str, *args: str) -> list[str]:
        return [
            java, "-Xms128m", f"-Xmx{self.settings.heap}", "-XX:MaxMetaspaceSize=256m", "-XX:+UseSerialGC",
            "-Djava.awt.headless=true", f"-Dlog4j2.configurationFile={HERE / 'log4j2.properties'}",
            "-cp", f"{self.libs_dir.resolve()}/*", main, *args,
        ]

    # -- lifecycle -------------------------------------------------------------

    def cluster_id(self) -> str | None:
        meta = self.data_dir / "meta.properties"
        if not meta.exists():
            return None
        match = re.search(r"^cluster\.id=(\S+)$", meta.read_text(), re.M)
        return match.group(1) if match else None

    def format(self, java: str) -> str:
        """Write the config and format storage once; a formatted data dir keeps its cluster id."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.config_file.write_text(server_properties(self.settings, self.data_dir))
        existing = self.cluster_id()
        if existing:
            return existing
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        cmd = self._java_cmd(java, "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(self.config_file))
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise BrokerStartFailed(f"formatting {self.data_dir} failed: {(done.stdout + done.stderr).strip()[-400:]}")
        return cluster_id

    def pid(self) -> int | None:
        """The live broker's PID from the PID file; a stale file is removed."""
        try:
            pid = int(self.pid_file.read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            self.pid_file.unlink(missing_ok=True)
            return None
        if b"kafka.Kafka" not in cmdline:
            self.pid_file.unlink(missing_ok=True)
            return None
        return pid

    def start(self) -> int:
        """Start the broker (or find it running) and return once it answers metadata requests."""
        pid = self.pid()
        if pid is not None:
            self.wait_ready(pid)
            return pid
        java = self.check_java()
        self.fetch()
        for port in (self.settings.port, self.settings.controller_port):
            _require_free(self.settings.host, port)
        self.format(java)
        with self.log_file.open("ab") as log:
            process = subprocess.Popen(
                self._java_cmd(java, "kafka.Kafka", str(self.config_file)),
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )
        self.pid_file.write_text(f"{process.pid}\n")
        self.wait_ready(process.pid, process)
        return process.pid

    def wait_ready(self, pid: int, process: subprocess.Popen[bytes] | None = None) -> None:
        deadline = time.monotonic() + self.settings.start_timeout_s
        expected = self.cluster_id()
        while time.monotonic() < deadline:
            if (process is not None and process.poll() is not None) or not _alive(pid):
                self.pid_file.unlink(missing_ok=True)
                raise BrokerStartFailed(f"the Kafka broker exited during start-up; last log lines: {self._log_tail()}")
            found = self.probe()
            if found is not None:
                if found != expected:
                    raise BrokerStartFailed(f"{self.bootstrap} answers as cluster {found}, not ours ({expected})")
                return
            time.sleep(0.5)
        raise BrokerStartFailed(
            f"the Kafka broker (pid {pid}) did not answer a metadata request within "
            f"{self.settings.start_timeout_s:.0f}s; see {self.log_file}"
        )

    def probe(self, timeout_s: float = 5.0) -> str | None:
        """Cluster id from a real metadata request, or None if nobody answers."""

        async def describe() -> str | None:
            admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=int(timeout_s * 1000))
            try:
                await admin.start()
                cluster = await admin.describe_cluster()
                return str(cluster["cluster_id"])
            finally:
                await admin.close()

        quiet = logging.getLogger("aiokafka")
        level = quiet.level
        quiet.setLevel(logging.CRITICAL)  # connection refusals are expected while it boots
        try:
            return asyncio.run(asyncio.wait_for(describe(), timeout_s))
        except Exception:  # any failure to answer means "not ready", never a crash
            return None
        finally:
            quiet.setLevel(level)

    def stop(self, force: bool = False) -> bool:
        """SIGTERM (or SIGKILL when forced), escalate after stop_timeout_s; False if it was not running."""
        pid = self.pid()
        if pid is None:
            return False
        os.kill(pid, signal.SIGKILL if force else signal.SIGTERM)
        deadline = time.monotonic() + self.settings.stop_timeout_s
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
            while _alive(pid):
                time.sleep(0.1)
        self.pid_file.unlink(missing_ok=True)
        return True

    def status(self) -> BrokerStatus:
        pid = self.pid()
        return BrokerStatus(
            running=pid is not None,
            ready=pid is not None and self.probe() == self.cluster_id(),
            pid=pid,
            bootstrap=self.bootstrap,
            cluster_id=self.cluster_id(),
            version=self.settings.version,
            jars_fetched=self.jars_fetched(),
            state_dir=self.state_dir,
        )

    def wipe(self) -> None:
        if self.pid() is not None:
            raise BrokerBusy("the broker is running; stop it (tether kafka down) before wiping its data")
        shutil.rmtree(self.data_dir, ignore_errors=True)

    def _log_tail(self, lines: int = 5) -> str:
        try:
            return " | ".join(self.log_file.read_text(errors="replace").strip().splitlines()[-lines:])
        except OSError:
            return "(no log)"


def _alive(pid: int) -> bool:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reap our own exited child so it does not linger as a zombie
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still answers kill(0); it is dead for our purposes.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False


def _require_free(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise PortInUse(
                f"port {port} on {host} is taken by another process; set TETHER_KAFKA_PORT / "
                "TETHER_KAFKA_CONTROLLER_PORT to free ones"
            ) from exc
