"""The whole local stack as processes: Kafka, engine, gateway, stream processors (with the analytics sink), trainer.

With `gateway_replicas` above 1 the gateway runs as that many replicas behind
HAProxy (`infra/loadbalancer.py`) on the gateway's address, as a Kubernetes
Service would put them; each replica keeps its gateway id across restarts.

Each service runs from the `tether` command itself, with a PID file (pid and
kernel start time, so a recycled pid is not mistaken for it) under the stack
folder and its log under the run's folder. The engine and each gateway run
under `infra.supervisor`, which holds their listening socket and starts them
again when they die: harnesses' connections wait in the backlog meanwhile
instead of being refused. Their PID file names the supervisor.

One stack runs per home folder. `up` records which (its run id, ports and
replicas, in `stack/stack.json`), so that `status` and `down` act on the stack
that runs, whatever the environment of the shell that asks says. `up` starts
what is not running and waits for each part to be healthy before the next,
naming the part that failed; `down` stops them in reverse order and leaves
nothing running.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from infra.errors import InfraError
from infra.kafka.launcher import KafkaBroker
from infra.kafka.settings import BrokerSettings
from infra.loadbalancer import config as haproxy_config
from infra.loadbalancer import haproxy
from infra.processes import alive, children_of, running_pid, spawn, stop_group, tail, write_pid_file
from schemas.rollout_token import DEVELOPMENT_ADMIN_KEY, DEVELOPMENT_SECRET, SECRET_PATTERN

_STOP_GRACE_S = 30.0  # each service's time from SIGTERM to SIGKILL on `down`
#: What `up` records of the stack it starts: every setting that names its processes (no secrets).
_RECORDED = ("run_id", "engine_port", "gateway_port", "gateway_replicas", "with_trainer")


class StackError(InfraError):
    """A part of the stack failed to start or to stop."""


class StackSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TETHER_STACK_", frozen=True)

    run_id: str = Field("demo", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    home: Path = Field(Path(".tether"), description="Stack state (PID files) and runs (logs, checkpoints).")
    model: Path = Field(Path(".tether/models/tiny"), description="The model the engine serves and trains.")
    engine_port: int = Field(8100, ge=1, le=65535)
    gateway_port: int = Field(8000, ge=1, le=65535)
    gateway_replicas: int = Field(1, ge=1, le=16, description="Above 1: replicas on the next ports, HAProxy in "
                                  "front on gateway_port.")
    secret: str = Field(DEVELOPMENT_SECRET, min_length=8, pattern=SECRET_PATTERN)
    admin_key: str = Field(DEVELOPMENT_ADMIN_KEY, min_length=8)
    trainer: dict[str, object] = Field(default_factory=dict, description="Overrides of the trainer's YAML.")
    with_trainer: bool = True
    start_timeout_s: float = Field(300.0, gt=0)

    @property
    def run_dir(self) -> Path:
        return self.home / "runs" / self.run_id

    @property
    def engine_url(self) -> str:
        return f"http://127.0.0.1:{self.engine_port}"

    @property
    def gateway_url(self) -> str:
        return f"http://127.0.0.1:{self.gateway_port}"


@dataclass(frozen=True)
class Service:
    name: str
    argv: list[str]
    env: dict[str, str]
    health: Callable[[], bool]
    #: a server on this loopback port runs under the supervisor that keeps the port listening across restarts
    supervised_port: int | None = None

    @property
    def command(self) -> list[str]:
        """What the stack starts: `argv`, or the supervisor running it."""
        if self.supervised_port is None:
            return self.argv
        return [sys.executable, "-m", "infra.supervisor", "--port", str(self.supervised_port), "--", *self.argv]


def _http_ok(url: str) -> Callable[[], bool]:
    def probe() -> bool:
        try:
            return httpx.get(url, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False
    return probe


class Stack:
    def __init__(self, settings: StackSettings, broker: KafkaBroker | None = None) -> None:
        self.settings = settings
        self.broker = broker or KafkaBroker(BrokerSettings())
        self.pids = settings.home / "stack"
        self.logs = settings.run_dir / "logs"

    def services(self) -> list[Service]:
        s, bus = self.settings, self.broker.client_env  # each service reaches Kafka as its own user
        tether = [sys.executable, "-m", "tether.cli"]
        trainer_yaml = s.run_dir / "trainer.yaml"
        parts = [
            Service("engine", [*tether, "engine", "serve", "--model", str(s.model), "--port", str(s.engine_port)],
                    {}, _http_ok(f"{s.engine_url}/health"), supervised_port=s.engine_port),
            *self._gateways(tether, bus("gateway")),
            Service("processors", [*tether, "processors", "run", "--run", s.run_id],
                    {**bus("processors"), "TETHER_PROCESSOR_APP_ID": f"tether-processor-{s.run_id}",
                     "TETHER_PROCESSOR_DATA_DIR": str((s.run_dir / "processor").resolve()),
                     "TETHER_PROCESSOR_CLICKHOUSE_DSN": f"chdb://{(s.run_dir / 'clickhouse').resolve()}"},
                    lambda: True),
        ]
        if s.with_trainer:
            parts.append(Service("trainer", [*tether, "trainer", "run", str(trainer_yaml)], bus("trainer"),
                                 lambda: True))
        return parts

    def _gateways(self, tether: list[str], bus: dict[str, str]) -> list[Service]:
        """One gateway, or replicas and their load balancer; a replica's id outlives its process, so a restarted
        one rejoins the run as itself (the trainer waits for no ghost)."""
        s = self.settings
        replicas = [("gateway", s.gateway_port)] if s.gateway_replicas == 1 else \
            [(f"gateway-{i}", s.gateway_port + i) for i in range(1, s.gateway_replicas + 1)]
        parts = [Service(name, [*tether, "gateway", "serve", "--engine", s.engine_url, "--tokenizer", str(s.model),
                                "--port", str(port), "--run-id", s.run_id],
                         {**bus, "TETHER_GATEWAY_SECRET": s.secret, "TETHER_GATEWAY_ADMIN_KEY": s.admin_key,
                          "TETHER_GATEWAY_GATEWAY_ID": f"{s.run_id}-{name}",
                          "TETHER_GATEWAY_PUBLIC_URL": s.gateway_url},
                         _http_ok(f"http://127.0.0.1:{port}/health"), supervised_port=port)
                 for name, port in replicas]
        if s.gateway_replicas > 1:
            parts.append(Service("gateway-lb", [haproxy(), "-db", "-f", str(self._lb_config)], {},
                                 _http_ok(f"{s.gateway_url}/health")))
        return parts

    @property
    def _lb_config(self) -> Path:
        return self.pids / "haproxy.cfg"

    def _write_lb_config(self) -> None:
        s = self.settings
        replicas = [(f"gateway-{i}", s.gateway_port + i) for i in range(1, s.gateway_replicas + 1)]
        self._lb_config.write_text(haproxy_config(port=s.gateway_port, replicas=replicas))

    def _pid_file(self, name: str) -> Path:
        return self.pids / f"{name}.pid"

    @classmethod
    def recorded(cls, settings: StackSettings, broker: KafkaBroker | None = None) -> Stack | None:
        """The stack `up` last started under `settings.home` (its recorded settings over `settings`), or None."""
        try:
            found = json.loads((settings.home / "stack" / "stack.json").read_text())
            return cls(settings.model_copy(update={k: found[k] for k in _RECORDED}), broker)
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _record(self) -> None:
        (self.pids / "stack.json").write_text(json.dumps({k: getattr(self.settings, k) for k in _RECORDED}))

    def running(self) -> bool:
        return any(pid is not None for pid in self.status().values())

    def pid(self, name: str) -> int | None:
        """The service's pid if it runs (and is the process we started). A service that died as a child of this
        process is a zombie until reaped: it counts as gone (and is reaped), so `up` starts it again."""
        pid = running_pid(self._pid_file(name))
        return pid if pid is not None and alive(pid) else None

    def server_pid(self, name: str) -> int | None:
        """The pid of the server a supervised service runs now (it changes when the server restarts); for an
        unsupervised service, the service's own pid."""
        pid = self.pid(name)
        if pid is None:
            return None
        if next(s for s in self.services() if s.name == name).supervised_port is None:
            return pid
        servers = [child for child in children_of(pid) if alive(child)]
        return servers[0] if servers else None  # between two of its lives

    def _write_trainer_config(self) -> None:
        s = self.settings
        config = {"run_id": s.run_id, "model": str(s.model.resolve()), "engine_url": s.engine_url,
                  "checkpoint_dir": str((s.run_dir / "checkpoints").resolve()), **s.trainer}
        (s.run_dir / "trainer.yaml").write_text(yaml.safe_dump(config))

    def up(self, say: Callable[[str], None] = lambda _: None) -> None:
        """Start what is not running, in order, each healthy before the next. Idempotent; refused while another
        run's stack runs under the same home."""
        other = Stack.recorded(self.settings, self.broker)
        if other is not None and other.settings.run_id != self.settings.run_id and other.running():
            raise StackError(f"the stack of run {other.settings.run_id!r} runs under {self.settings.home}: "
                             "`tether down` it first (one stack per home folder)")
        self.pids.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        self._record()
        say(f"Kafka: pid {self.broker.start()} on {self.broker.bootstrap}")  # starts it unless it runs
        import asyncio

        from schemas.admin import ensure_topics

        asyncio.run(ensure_topics(self.broker.client_settings()))
        if not (self.settings.model / "tokenizer.json").exists():
            raise StackError(f"no model at {self.settings.model}: build one with `tether model init-tiny --out "
                             f"{self.settings.model}`")
        if self.settings.with_trainer:
            self._write_trainer_config()
        if self.settings.gateway_replicas > 1:
            self._write_lb_config()
        for service in self.services():
            if self.pid(service.name) is not None:
                say(f"{service.name}: running (pid {self.pid(service.name)})")
                continue
            self._start(service)
            say(f"{service.name}: started (pid {self.pid(service.name)}, log {self.logs / service.name}.log)")

    def _start(self, service: Service) -> None:
        log = self.logs / f"{service.name}.log"
        process = spawn(service.command, log, env={**os.environ, **service.env})
        write_pid_file(self._pid_file(service.name), process.pid)
        deadline = time.monotonic() + self.settings.start_timeout_s
        settle = time.monotonic() + 3.0  # a service without a health endpoint must at least stay up this long
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise StackError(f"the {service.name} exited with {process.returncode} while starting; "
                                 f"last lines of {log}: {tail(log)}")
            if service.health() and time.monotonic() >= settle:
                return
            time.sleep(0.25)
        raise StackError(f"the {service.name} did not become healthy within {self.settings.start_timeout_s:.0f} s; "
                         f"see {log}: {tail(log)}")

    def down(self, say: Callable[[str], None] = lambda _: None, keep_kafka: bool = False) -> None:
        """Stop every part, last started first; Kafka last (unless kept)."""
        for service in reversed(self.services()):
            pid = self.pid(service.name)
            if pid is not None:
                stop_group(pid, _STOP_GRACE_S)
                say(f"{service.name}: stopped")
            self._pid_file(service.name).unlink(missing_ok=True)
        (self.pids / "stack.json").unlink(missing_ok=True)
        if not keep_kafka and self.broker.stop():
            say("Kafka: stopped")

    def status(self) -> dict[str, int | None]:
        found: dict[str, int | None] = {s.name: self.pid(s.name) for s in self.services()}
        return found
