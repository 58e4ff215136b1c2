"""The chaos bench's run: what it starts, and the faults it inflicts on it.

Everything the bench runs lives here, apart from how the run is ordered and reported (bench/chaos.py): the
three-broker cluster and the stack built for it, the parts not in the stack's own list (a second processors
worker, the controller with its config and harness), and the fault schedule's one step, a SIGKILL of one part,
its time down and its restart, measured. The Kafka launcher restarts a killed node itself once the cluster has
fenced it, so a broker fault is a kill and a start like the others.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from chaos_monitor import Monitor

from infra.kafka.launcher import KafkaBroker
from infra.kafka.settings import BrokerSettings
from infra.processes import free_port, free_port_block, spawn, stop_group
from schemas import topics
from schemas.admin import admin_client
from schemas.events import Event, RolloutStarted, TaskGroup, WeightVersionPublished
from schemas.settings import BusSettings
from tether.stack import Stack, StackSettings
from tether.tiny_model import init_tiny

HARNESS = Path(__file__).parent / "chaos_harness.py"
FAULTS = ("broker", "gateway-replica", "gateway-restart", "processors", "trainer", "controller")
STACK_FAULTS = {  # fault → (the stack's service killed, what the table calls it); `tether up` restarts it
    "gateway-replica": ("gateway-1", "gateway-1 of 2"),  # HAProxy sends its rollouts to gateway-2 meanwhile
    "processors": ("processors", "processors worker 1 of 2"),  # the second worker keeps running
    "trainer": ("trainer", "trainer"),
}
RECOVERY: dict[str, type[Event]] = {  # fault → the event its part publishes first once it has recovered
    "processors": TaskGroup, "trainer": WeightVersionPublished, "controller": RolloutStarted}


@dataclass
class Fault:
    name: str
    what: str
    killed: float
    back: float  # the part restarted and ready again
    recovered: float | None = None  # by the fault's own measure (see bench/chaos.py's docstring)


@dataclass
class Run:
    args: argparse.Namespace
    scratch: Path
    broker: KafkaBroker
    stack: Stack
    monitor: Monitor
    calls_dir: Path
    controller: subprocess.Popen[bytes] | None = None
    second_worker: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    stopped: float = 0.0
    faults: list[Fault] = field(default_factory=list)

    @property
    def settings(self) -> StackSettings:
        return self.stack.settings

    # the parts not in the stack's own list

    def start_second_worker(self) -> None:
        """A second `tether processors run`, as the stack starts its own (same app id: the partitions are shared),
        with a state folder of its own and no analytics sink (the stack's worker has it)."""
        first = next(s for s in self.stack.services() if s.name == "processors")
        env = {**os.environ, **first.env, "TETHER_PROCESSOR_DATA_DIR": str((self.settings.run_dir /
                                                                            "processor-2").resolve()),
               "TETHER_PROCESSOR_CLICKHOUSE_DSN": ""}
        self.second_worker = spawn(first.command, self.stack.logs / "processors-2.log", env=env)

    def start_controller(self) -> None:
        s = self.settings
        env = {**os.environ, **self.broker.client_env("controller"),
               "TETHER_CONTROLLER_GATEWAY_URL": s.gateway_url, "TETHER_CONTROLLER_GATEWAY_ADMIN_KEY": s.admin_key,
               "TETHER_CONTROLLER_GATEWAY_SECRET": s.secret}
        with (s.run_dir / "controller.log").open("ab") as log:
            self.controller = subprocess.Popen(
                [sys.executable, "-m", "tether.cli", "controller", "run", str(s.run_dir / "controller.yaml")],
                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def write_controller_config(self) -> None:
        a, s = self.args, self.settings
        n_tasks = 10_000  # more than any run gets through: the bench stops the controller at the end
        (s.run_dir / "tasks.jsonl").write_text("".join(json.dumps({"id": f"t{i}"}) + "\n" for i in range(n_tasks)))
        (s.run_dir / "controller.yaml").write_text(yaml.safe_dump({
            "run_id": s.run_id, "dataset": "tasks.jsonl", "group_size": a.group_size, "concurrency": a.concurrency,
            "max_groups_in_flight": max(2, a.concurrency // a.group_size + 1), "timeout_s": 300, "log_dir": "rollouts",
            "harness": {"command": [sys.executable, str(HARNESS.resolve()), "--out",
                                    str(self.calls_dir.resolve() / "{rollout_id}.jsonl"), "--turns", str(a.turns),
                                    "--interval", str(a.interval), "--max-tokens", str(a.max_tokens)],
                        "preload": ["openai"]}, "sandbox": False}))

    def stop_controller(self, timeout_s: float = 90) -> bool:
        """SIGINT (it cancels the rollouts still running, then exits); killed if it has not exited within
        `timeout_s`. Whether it stopped by itself."""
        assert self.controller is not None
        self.controller.send_signal(signal.SIGINT)
        try:
            self.controller.wait(timeout_s)
            return True
        except subprocess.TimeoutExpired:
            self.controller.kill()
            return False

    def stop_own_parts(self) -> None:
        """The monitor, the controller and the second worker: what the stack does not stop."""
        self.monitor.stopping.set()
        if self.controller is not None and self.controller.poll() is None:
            self.controller.kill()
        if self.second_worker is not None:
            stop_group(self.second_worker.pid, 30)

    # the faults

    def fault(self, name: str) -> Fault:
        """One fault: the part SIGKILLed, `--down` s without it, restarted; when it was killed and back."""
        if name == "broker":
            return self._broker_fault()
        if name == "controller":
            return self._controller_fault()
        if name == "gateway-restart":
            return self._server_fault("gateway" if self.settings.gateway_replicas == 1 else "gateway-1")
        if name not in STACK_FAULTS:
            raise ValueError(name)
        service, what = STACK_FAULTS[name]
        killed = self._kill_service(service)
        time.sleep(self.args.down)
        self.stack.up()
        back = time.time()
        # a replica has recovered once it is ready again; the others by what they publish next (finish_recovery)
        return Fault(name, what, killed, back, back if name == "gateway-replica" else None)

    def _server_fault(self, service: str) -> Fault:
        """The service's server SIGKILLed, its supervisor left alone: no `tether up`, no `--down`; the supervisor
        starts it again at once on the listening socket it holds. Back: a new server answers its health check."""
        victim = self.stack.server_pid(service)
        if victim is None:
            raise RuntimeError(f"{service} is not running before its fault")
        probe = next(s for s in self.stack.services() if s.name == service).health
        killed = time.time()
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 120
        while self.stack.server_pid(service) in (None, victim) or not probe():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{service} was not back within 120 s of its server's death; see its log")
            time.sleep(0.05)
        back = time.time()
        what = f"{service}'s server (supervisor kept its socket)"
        return Fault("gateway-restart", what, killed, back, back)

    def _broker_fault(self) -> Fault:
        victim = asyncio.run(calls_leader(self.broker.client_settings()))
        killed = time.time()
        self.broker.stop(force=True, node=victim)
        time.sleep(self.args.down)
        # the killed node again, on its intact disk: the launcher waits until the cluster has fenced it (started
        # while still registered, it would be refused), starts it and returns once the cluster is ready
        self.broker.start()
        back = time.time()
        return Fault("broker", f"broker {victim} (leader of tether.calls/0)", killed, back, back)

    def _controller_fault(self) -> Fault:
        assert self.controller is not None
        killed = time.time()
        self.controller.kill()
        self.controller.wait()
        time.sleep(self.args.down)
        self.start_controller()  # it re-attaches to the harnesses still running
        return Fault("controller", "controller", killed, time.time())

    def _kill_service(self, name: str) -> float:
        pid = self.stack.pid(name)
        if pid is None:
            raise RuntimeError(f"{name} is not running before its fault")
        killed = time.time()
        os.killpg(pid, signal.SIGKILL)  # the whole process group, as a crashed container goes
        # `stack.up()` ran in this process, so the service is its child: reap it, or the pid file's check (which
        # counts a zombie as running) has `tether up` think it still runs
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        return killed

    def finish_recovery(self, fault: Fault) -> None:
        """Recovery by the fault's own measure, for those that come from the topics."""
        kind = RECOVERY.get(fault.name)
        if kind is not None:
            fault.recovered = self.monitor.first_after(kind, fault.killed)


def prepare(args: argparse.Namespace) -> Run:
    """The run, nothing started yet: a scratch folder, a three-broker cluster on a free block of ports, the stack
    on it (`--replicas` gateways, the trainer updating every `--batch-groups` groups), the monitor."""
    scratch = Path(tempfile.mkdtemp(prefix="tether-chaos-"))
    base = free_port_block()
    broker = KafkaBroker(BrokerSettings(state_dir=scratch / "kafka", brokers=3, port=base, controller_port=base + 1,
                                        heap=args.heap, start_timeout_s=240, security=args.security))
    run_id = "chaos"
    settings = StackSettings(run_id=run_id, home=scratch / "home", model=init_tiny(scratch / "tiny"),
                             engine_port=free_port(), gateway_port=free_port_block(args.replicas + 1),
                             gateway_replicas=args.replicas, trainer={
                                 "batch_groups": args.batch_groups, "max_staleness": 100, "zero_variance": "keep",
                                 "lr": 1e-4})
    calls_dir = scratch / "calls"
    calls_dir.mkdir()
    return Run(args, scratch, broker, Stack(settings, broker=broker), Monitor(broker.client_settings, run_id),
               calls_dir)


async def calls_leader(bus: BusSettings) -> int:
    async with admin_client(bus) as admin:
        (calls,) = await admin.describe_topics([topics.CALLS.name])
    return int(next(p for p in calls["partitions"] if p["partition"] == 0)["leader"])
