"""Format, start, probe and stop a single-node KRaft broker, found again by its PID file.

`up`, `down` and `status` work from any later process. Readiness means the
broker answered a real metadata request with the cluster id we formatted, not
that a port opened. Start and stop hold a lock on the state folder, so two
`tether kafka up` at once start one broker.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import fcntl
import logging
import re
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from aiokafka.admin import AIOKafkaAdminClient

from infra.errors import BrokerBusy, BrokerStartFailed, PortInUse
from infra.kafka import jars
from infra.kafka.config import server_properties
from infra.kafka.settings import BrokerSettings
from infra.processes import alive, spawn, stop_group, tail

LOG4J = Path(__file__).parent / "log4j2.properties"


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
    bootstrap: str
    cluster_id: str | None
    version: str
    jars_fetched: bool
    state_dir: Path


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

    def fetch(self) -> Path:
        return jars.fetch(self.libs_dir, self.settings.version)

    def cluster_id(self) -> str | None:
        meta = self.data_dir / "meta.properties"
        if not meta.exists():
            return None
        match = re.search(r"^cluster\.id=(\S+)$", meta.read_text(), re.M)
        return match.group(1) if match else None

    def pid(self) -> int | None:
        """The live broker's PID from the PID file; a stale file (or a reused PID) is removed."""
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

    def start(self) -> int:
        """Start the broker (or find it running) and return its PID once it answers metadata requests."""
        with self._locked():
            pid = self.pid()
            if pid is not None:
                self._wait_ready(pid)
                return pid
            java = jars.find_java()
            self.fetch()
            for port in (self.settings.port, self.settings.controller_port):
                _require_free(self.settings.host, port)
            self._format(java)
            process = spawn(self._java_cmd(java, "kafka.Kafka", str(self.config_file.resolve())), self.log_file)
            self.pid_file.write_text(f"{process.pid}\n")
            try:
                self._wait_ready(process.pid, process)
            except BaseException:
                self._stop(force=True)  # never leave a half-started broker behind
                raise
            return process.pid

    def stop(self, force: bool = False) -> bool:
        """SIGTERM (SIGKILL when forced), escalating after stop_timeout_s; False if it was not running."""
        with self._locked():
            return self._stop(force)

    def probe(self, timeout_s: float = 5.0) -> str | None:
        """Cluster id from a real metadata request, or None if nobody answers. Safe inside an event loop."""

        async def describe() -> str | None:
            admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=int(timeout_s * 1000))
            try:
                await admin.start()
                return str((await admin.describe_cluster())["cluster_id"])
            finally:
                await admin.close()

        def run() -> str | None:
            try:
                return asyncio.run(asyncio.wait_for(describe(), timeout_s))
            except Exception:  # any failure to answer means "not ready", never a crash
                return None

        quiet = logging.getLogger("aiokafka")
        level = quiet.level
        quiet.setLevel(logging.CRITICAL)  # connection refusals are expected while it boots
        try:
            with concurrent.futures.ThreadPoolExecutor(1) as pool:  # its own loop, whoever calls
                return pool.submit(run).result()
        finally:
            quiet.setLevel(level)

    def status(self) -> BrokerStatus:
        pid = self.pid()
        return BrokerStatus(
            running=pid is not None,
            ready=pid is not None and self.probe() == self.cluster_id(),
            pid=pid,
            bootstrap=self.bootstrap,
            cluster_id=self.cluster_id(),
            version=self.settings.version,
            jars_fetched=jars.fetched(self.libs_dir),
            state_dir=self.state_dir,
        )

    def wipe(self) -> None:
        with self._locked():
            if self.pid() is not None:
                raise BrokerBusy("the broker is running; stop it (tether kafka down) before wiping its data")
            shutil.rmtree(self.data_dir, ignore_errors=True)

    # -- internals ---------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with (self.state_dir / ".lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def _java_cmd(self, java: str, main: str, *args: str) -> list[str]:
        return [
            java, "-Xms128m", f"-Xmx{self.settings.heap}", "-XX:MaxMetaspaceSize=256m", "-XX:+UseSerialGC",
            "-Djava.awt.headless=true", f"-Dlog4j2.configurationFile={LOG4J}",
            "-cp", f"{self.libs_dir.resolve()}/*", main, *args,
        ]

    def _format(self, java: str) -> str:
        """Write the config and format storage once; a formatted data dir keeps its cluster id."""
        self.config_file.write_text(server_properties(self.settings, self.data_dir))
        existing = self.cluster_id()
        if existing:
            return existing
        cluster_id = new_cluster_id()
        cmd = self._java_cmd(java, "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(self.config_file))
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise BrokerStartFailed(f"formatting {self.data_dir} failed: {(done.stdout + done.stderr).strip()[-400:]}")
        return cluster_id

    def _wait_ready(self, pid: int, process: subprocess.Popen[bytes] | None = None) -> None:
        deadline = time.monotonic() + self.settings.start_timeout_s
        expected = self.cluster_id()
        while time.monotonic() < deadline:
            if (process is not None and process.poll() is not None) or not alive(pid):
                raise BrokerStartFailed("the Kafka broker exited during start-up; last log lines: "
                                        f"{tail(self.log_file)}")
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

    def _stop(self, force: bool) -> bool:
        pid = self.pid()
        if pid is None:
            return False
        # The broker leads its own session (spawn), so its group is the broker alone.
        stop_group(pid, self.settings.stop_timeout_s, first=signal.SIGKILL if force else signal.SIGTERM, poll_s=0.2)
        self.pid_file.unlink(missing_ok=True)
        return True


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
