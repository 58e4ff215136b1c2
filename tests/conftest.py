"""Shared fixtures: one real Kafka broker per test session, started by the project's own launcher."""

from __future__ import annotations

import asyncio
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

settings.register_profile(
    "default", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
settings.load_profile("default")


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
        process.terminate()
        process.wait(timeout=30)
        log.close()
