"""Shared fixtures: one real Kafka broker per test session, started by the project's own launcher."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, settings

from infra.kafka.launcher import KafkaBroker
from infra.kafka.settings import BrokerSettings
from schemas.admin import ensure_topics
from schemas.producer import EventProducer
from schemas.settings import BusSettings

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm must not fetch anything at import

settings.register_profile(
    "default", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
settings.load_profile("default")


def stop(process: subprocess.Popen[bytes]) -> None:
    """Terminate, and kill if it does not go within 30 s: a test never leaves a server behind."""
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=30)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def broker_settings(state_dir: Path) -> BrokerSettings:
    """A broker on free ports with its own data, so tests never touch a developer's `tether kafka up`."""
    return BrokerSettings(state_dir=state_dir, port=free_port(), controller_port=free_port(), heap="384m")


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    kafka = KafkaBroker(broker_settings(tmp_path_factory.mktemp("kafka")))
    try:
        kafka.start()
        yield kafka
    finally:
        kafka.stop()


@pytest.fixture(scope="session")
def bus(broker: KafkaBroker) -> BusSettings:
    settings = BusSettings(bootstrap_servers=broker.bootstrap, delivery_timeout_s=60)
    asyncio.run(ensure_topics(settings))
    return settings


@pytest.fixture
async def producer(bus: BusSettings) -> AsyncIterator[EventProducer]:
    async with EventProducer(bus) as p:
        yield p


@pytest.fixture
def run_id() -> str:
    """A fresh run id per test: tests share topics and filter by it."""
    return f"run-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's own tiny model, built once per session with the same command users run."""
    from trainer.tiny_model import init_tiny

    return init_tiny(tmp_path_factory.mktemp("models") / "tiny", seed=0)


@dataclass(frozen=True)
class RunningEngine:
    url: str
    model: str
    process: subprocess.Popen[bytes]


@pytest.fixture(scope="session")
def engine_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningEngine]:
    """`tether engine serve` as its own process, on a free port."""
    port = free_port()
    log = (tmp_path_factory.mktemp("engine") / "engine.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "tether.cli", "engine", "serve", "--model", str(tiny_model), "--port", str(port)],
        stdout=log, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"engine exited with {process.returncode}; see {log.name}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.3)
    else:
        process.kill()
        raise RuntimeError(f"engine did not become healthy; see {log.name}")
    try:
        yield RunningEngine(url, str(tiny_model), process)
    finally:
        stop(process)
        log.close()


ADMIN_KEY = "test-admin-key"
SECRET = "test-gateway-secret"


@dataclass(frozen=True)
class RunningGateway:
    url: str
    run_id: str
    process: subprocess.Popen[bytes]
    log: Path

    def admin(self) -> dict[str, str]:
        return {"authorization": f"Bearer {ADMIN_KEY}"}

    def register(self, rollout_id: str) -> str:
        """Register a rollout as the controller does; returns its token."""
        from schemas.rollout_token import mint

        r = httpx.post(f"{self.url}/admin/rollouts", json={"rollout_id": rollout_id, "run_id": self.run_id},
                       headers=self.admin())
        r.raise_for_status()
        return mint(rollout_id, SECRET)


def start_gateway(bus: BusSettings, engine: RunningEngine, tiny_model: Path, log: Path, run_id: str,
                  **env: str) -> RunningGateway:
    port = free_port()
    out = log.open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "tether.cli", "gateway", "serve", "--engine", engine.url, "--tokenizer",
         str(tiny_model), "--port", str(port), "--run-id", run_id],
        stdout=out, stderr=subprocess.STDOUT,
        env={**os.environ, "TETHER_BUS_BOOTSTRAP_SERVERS": bus.bootstrap_servers, "TETHER_GATEWAY_SECRET": SECRET,
             "TETHER_GATEWAY_ADMIN_KEY": ADMIN_KEY, "TETHER_BUS_DELIVERY_TIMEOUT_S": "5", **env},
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"gateway exited with {process.returncode}: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return RunningGateway(url, run_id, process, log)
        except httpx.HTTPError:
            time.sleep(0.3)
    process.kill()
    raise RuntimeError(f"gateway did not become healthy: {log.read_text()[-2000:]}")


@pytest.fixture(scope="session")
def gateway_server(bus: BusSettings, engine_server: RunningEngine, tiny_model: Path,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    gw = start_gateway(bus, engine_server, tiny_model, tmp_path_factory.mktemp("gateway") / "gateway.log",
                       run_id=f"run-{uuid.uuid4().hex[:8]}")
    try:
        yield gw
    finally:
        stop(gw.process)


TOOL_REPLY = '<tool_call>\n{"name": "lookup", "arguments": {"q": "x"}}\n</tool_call>'
FINAL_REPLY = "The answer is 42."


@pytest.fixture(scope="session")
def fake_vllm(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningEngine]:
    """FakeVLLM scripted as an agent's model: first a tool call, then an answer."""
    port = free_port()
    log = (tmp_path_factory.mktemp("fake-vllm") / "fake.log").open("wb")
    process = subprocess.Popen([sys.executable, "-m", "tests.fakes.vllm", "--tokenizer", str(tiny_model),
                                "--port", str(port), "--reply", TOOL_REPLY, "--reply", FINAL_REPLY],
                               stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.3)
    try:
        yield RunningEngine(url, "fake-vllm", process)
    finally:
        stop(process)
        log.close()


@pytest.fixture(scope="session")
def scripted_gateway(bus: BusSettings, fake_vllm: RunningEngine, tiny_model: Path,
                     tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    gw = start_gateway(bus, fake_vllm, tiny_model, tmp_path_factory.mktemp("gateway") / "scripted.log",
                       run_id=f"run-{uuid.uuid4().hex[:8]}")
    try:
        yield gw
    finally:
        stop(gw.process)
