"""Shared fixtures: one real Kafka broker per test session, started by the project's own launcher."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, settings

from infra.kafka.launcher import KafkaBroker
from infra.kafka.settings import BrokerSettings
from infra.processes import free_port, stop, wait_healthy
from schemas.admin import ensure_topics
from schemas.producer import EventProducer
from schemas.settings import BusSettings

pytest_plugins = ("tests.machine_report",)  # a failure's report carries what the machine said about it

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm must not fetch anything at import

settings.register_profile(
    "default", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
settings.load_profile("default")


def spawn(args: list[str], log: Path, what: str, port: int, env: dict[str, str] | None = None
          ) -> tuple[str, subprocess.Popen[bytes]]:
    """A server as its own process, its output in `log`; returns once /health answers."""
    with log.open("wb") as out:
        process = subprocess.Popen([sys.executable, "-m", *args], stdout=out, stderr=subprocess.STDOUT,
                                   env={**os.environ, **(env or {})})
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, process, what, log=log)
    return url, process


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
    from tether.tiny_model import init_tiny

    return init_tiny(tmp_path_factory.mktemp("models") / "tiny", seed=0)


@dataclass(frozen=True)
class RunningEngine:
    url: str
    model: str
    process: subprocess.Popen[bytes]


@contextmanager
def serve_engine(model: Path, log: Path, **env: str) -> Iterator[RunningEngine]:
    """`tether engine serve` as its own process, on a free port, for the length of a `with` block."""
    port = free_port()
    url, process = spawn(["tether.cli", "engine", "serve", "--model", str(model), "--port", str(port)],
                         log, "the engine", port, env)
    try:
        yield RunningEngine(url, str(model), process)
    finally:
        stop(process)


@pytest.fixture(scope="module")
def own_engine(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningEngine]:
    """An engine for one module alone: its tests change the engine's weights."""
    with serve_engine(tiny_model, tmp_path_factory.mktemp("engine") / "engine.log") as engine:
        yield engine


@pytest.fixture(scope="session")
def engine_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningEngine]:
    with serve_engine(tiny_model, tmp_path_factory.mktemp("engine") / "engine.log") as engine:
        yield engine


@pytest.fixture(scope="session")
def kube_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """FakeKubeAPI (tests/fakes/kube_api.py) as its own process; its URL."""
    port = free_port()
    url, process = spawn(["tests.fakes.kube_api", "--port", str(port)],
                         tmp_path_factory.mktemp("kube") / "kube.log", "FakeKubeAPI", port)
    try:
        yield url
    finally:
        stop(process)


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
    return gateway_at(free_port(), bus, engine, tiny_model, log, run_id, env)


def gateway_at(port: int, bus: BusSettings, engine: RunningEngine, tiny_model: Path, log: Path, run_id: str,
               env: dict[str, str] | None = None) -> RunningGateway:
    """A gateway process on `port` (a restarted one comes back where harnesses look for it)."""
    env = env or {}
    url, process = spawn(
        ["tether.cli", "gateway", "serve", "--engine", engine.url, "--tokenizer", str(tiny_model), "--port", str(port),
         "--run-id", run_id], log, "the gateway", port,
        # every prompt the suite sends is rendered both ways: resumed (or from remembered pieces) and whole
        env={"TETHER_BUS_BOOTSTRAP_SERVERS": bus.bootstrap_servers, "TETHER_GATEWAY_SECRET": SECRET,
             "TETHER_GATEWAY_ADMIN_KEY": ADMIN_KEY, "TETHER_BUS_DELIVERY_TIMEOUT_S": "5",
             "TETHER_GATEWAY_RENDER_CHECK_EVERY": "1", **env},
    )
    return RunningGateway(url, run_id, process, log)


def render_mismatches(gw: RunningGateway) -> float:
    """Prompts the gateway rendered otherwise than from their first message (0 where it cannot be asked)."""
    try:
        text = httpx.get(f"{gw.url}/metrics", timeout=5).text
    except httpx.HTTPError:
        return 0.0
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("tether_gateway_render_mismatches_total"))


@contextmanager
def gateway(bus: BusSettings, engine: RunningEngine, tiny_model: Path, log: Path, run_id: str | None = None,
            **env: str) -> Iterator[RunningGateway]:
    """A gateway process for the length of a `with` block."""
    gw = start_gateway(bus, engine, tiny_model, log, run_id or f"run-{uuid.uuid4().hex[:8]}", **env)
    try:
        yield gw
        mismatches = render_mismatches(gw)
        assert not mismatches, f"{mismatches:.0f} prompts differed from their whole rendering: see {log}"
    finally:
        stop(gw.process)


@pytest.fixture(scope="session")
def gateway_server(bus: BusSettings, engine_server: RunningEngine, tiny_model: Path,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    with gateway(bus, engine_server, tiny_model, tmp_path_factory.mktemp("gateway") / "gateway.log") as gw:
        yield gw


TOOL_REPLY = '<tool_call>\n{"name": "lookup", "arguments": {"q": "x"}}\n</tool_call>'
FINAL_REPLY = "The answer is 42."


@pytest.fixture(scope="session")
def fake_vllm(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningEngine]:
    """FakeVLLM scripted as an agent's model: first a tool call, then an answer."""
    port = free_port()
    url, process = spawn(["tests.fakes.vllm", "--tokenizer", str(tiny_model), "--port", str(port),
                          "--reply", TOOL_REPLY, "--reply", FINAL_REPLY],
                         tmp_path_factory.mktemp("fake-vllm") / "fake.log", "FakeVLLM", port)
    try:
        yield RunningEngine(url, "fake-vllm", process)
    finally:
        stop(process)


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[KafkaBroker]:
    """A broker of the test's own, for tests that stop or kill it."""
    kafka = KafkaBroker(broker_settings(tmp_path / "kafka"))
    try:
        kafka.start()
        yield kafka
    finally:
        kafka.stop(force=True)


@contextmanager
def scripted(bus: BusSettings, tiny_model: Path, folder: Path, replies: list[str] | tuple[str, ...],
             run_id: str | None = None) -> Iterator[RunningGateway]:
    """FakeVLLM with these replies and a gateway in front of it, for the length of a `with` block."""
    port = free_port()
    args = ["tests.fakes.vllm", "--tokenizer", str(tiny_model), "--port", str(port)]
    for reply in replies:
        args += ["--reply", reply]
    url, process = spawn(args, folder / "fake.log", "FakeVLLM", port)
    try:
        with gateway(bus, RunningEngine(url, "fake-vllm", process), tiny_model, folder / "gateway.log", run_id) as gw:
            yield gw
    finally:
        stop(process)


@pytest.fixture(scope="session")
def scripted_gateway(bus: BusSettings, fake_vllm: RunningEngine, tiny_model: Path,
                     tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    with gateway(bus, fake_vllm, tiny_model, tmp_path_factory.mktemp("gateway") / "scripted.log") as gw:
        yield gw


@pytest.fixture(scope="session")
def toolz_tasks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`tether swe build` of a real package (toolz 1.2.0, its sdist from PyPI, cached under .tether/swe): 8
    candidates, seed 1."""
    from swe.build import build

    out = tmp_path_factory.mktemp("swe") / "toolz"
    lines: list[str] = []
    build("toolz==1.2.0", out, cache=Path(__file__).parents[1] / ".tether" / "swe" / "sdists", max_candidates=8,
          max_failing=20, seed=1, timeout_s=300, say=lines.append)
    assert lines and "tests pass on the clean tree" in lines[0]
    return out
