"""Faults under load: parts of a live run SIGKILLed one at a time, with figures per fault and the run checked after.

    .venv/bin/python bench/chaos.py [--warmup 30] [--settle 25] [--down 5] [--concurrency 4] [--turns 8]
                                    [--faults broker,gateway-replica,processors,trainer,controller] [--keep]

The run: a three-broker plaintext KRaft cluster (the project's launcher,
replication factor 3, min.insync.replicas 2), `tether up`'s stack with two
gateway replicas behind HAProxy, the processors, a second processors worker
sharing tether.calls' partitions (same app id, its own state folder, no
analytics sink), the trainer updating every `--batch-groups` task groups, and
`tether controller run` as its own process running bench/chaos_harness.py
(the openai SDK, non-streaming and streaming calls alternately, one every
`--interval` s for `--turns` turns, then a reward). Each harness appends a
line per call to a file the bench reads.

The faults, one at a time, each SIGKILL followed by `--down` s without the
part, its restart, and `--settle` s of quiet:
  broker           the leader of tether.calls' partition 0, restarted on its intact disk
  gateway-replica  gateway-1 of the two (HAProxy sends its rollouts to gateway-2), then `tether up` again
  processors       the stack's worker (the other keeps running), then `tether up` again
  trainer          then `tether up` again (it resumes from its checkpoint and settles an interrupted update)
  controller       then started again (it re-attaches to the harnesses still running)

Per fault: time to recover (broker, replica: the part ready again; processors:
the next task group on tether.samples; trainer: the next weight version
published; controller: the next rollout launched) and the first call that
succeeded after the kill; calls/s and p99 latency as the harnesses saw them
before (the `--settle` s before the kill, at most 20), during (kill → part
back) and after (the same span after it); calls failed. After the run:
every call a harness got a 200 for is on tether.calls exactly once (matched
by the response id, which the gateway also records inside ModelCall's
response_json), each rollout's seqs unique, every rollout finished and none
failed, task groups exactly once on tether.samples, the replay equal to what
was trained, weight versions advancing across every fault. The plot goes to
bench/results/chaos.png.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

from infra.kafka.launcher import KafkaBroker
from infra.kafka.settings import BrokerSettings
from infra.processes import free_port, spawn, stop_group
from schemas import topics
from schemas.admin import admin_client
from schemas.consumer import EventConsumer
from schemas.events import (
    Event,
    ModelCall,
    RolloutFinished,
    RolloutStarted,
    TaskGroup,
    UpdateAborted,
    WeightVersionPublished,
)
from schemas.producer import EventProducer
from schemas.samples import read_groups
from schemas.settings import BusSettings
from stream_processors.grouping import Policy
from stream_processors.pipeline import compare, content_hash
from stream_processors.replay import replay
from tether.stack import Stack, StackSettings
from trainer import checkpoint
from trainer.tiny_model import init_tiny

from _shared import arguments, pyplot, save

console = Console(width=max(160, shutil.get_terminal_size().columns))
HARNESS = Path(__file__).parent / "chaos_harness.py"
FAULTS = ("broker", "gateway-replica", "processors", "trainer", "controller")


def free_port_block(span: int = 30) -> int:
    """A base port with base..base+span free: node K of the cluster uses base + 10*(K-1) + 0..1."""
    for _ in range(200):
        base = random.randrange(20_000, 32_000, 10)
        try:
            for port in range(base, base + span):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError("no free block of ports")


# -- the topics, followed live ------------------------------------------------------------------------------------


class Monitor(threading.Thread):
    """Follows tether.samples, tether.control and tether.rollouts from the start, noting when each of the run's
    events arrived (wall clock): task groups emitted, versions published, rollouts launched."""

    def __init__(self, bus: BusSettings, run_id: str) -> None:
        super().__init__(daemon=True, name="monitor")
        self.bus, self.run_id = bus, run_id
        self.seen: list[tuple[float, Event]] = []
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            asyncio.run(self._follow())
        except BaseException as exc:  # reported with the checks
            self.error = exc

    async def _follow(self) -> None:
        wanted = [topics.SAMPLES, topics.CONTROL, topics.ROLLOUTS]
        async with EventProducer(self.bus) as dlq, \
                EventConsumer(self.bus, wanted, dlq, name=f"chaos-monitor-{self.run_id}") as consumer:
            async for batch in consumer.batches(timeout_ms=300):
                now = time.time()
                self.seen += [(now, r.event) for r in batch if getattr(r.event, "run_id", None) == self.run_id]
                if self.stopping.is_set():
                    return

    @staticmethod
    def stamp(at: float, event: Event) -> float:
        """When it happened: the event's own time where its writer stamps it at writing (a version published, a
        rollout launched), else when the monitor read it (a task group's created_at is its data's, for replays)."""
        if isinstance(event, WeightVersionPublished):
            return event.published_at.timestamp()
        if isinstance(event, RolloutStarted):
            return event.started_at.timestamp()
        return at

    def first_after(self, kind: type[Event], t: float) -> float | None:
        return min((self.stamp(at, e) for at, e in list(self.seen) if isinstance(e, kind)
                    and self.stamp(at, e) > t), default=None)

    def lag(self) -> float:
        """The longest a published version took to reach the monitor: how far arrival times can be trusted."""
        return max((at - e.published_at.timestamp() for at, e in list(self.seen)
                    if isinstance(e, WeightVersionPublished)), default=0.0)

    def versions(self) -> list[tuple[float, int]]:
        return sorted((e.published_at.timestamp(), e.version) for _, e in list(self.seen)
                      if isinstance(e, WeightVersionPublished))

    def version_at(self, t: float) -> int:
        return max((v for at, v in self.versions() if at <= t), default=0)


# -- the run ------------------------------------------------------------------------------------------------------


@dataclass
class Fault:
    name: str
    what: str
    killed: float
    back: float  # the part restarted and ready again
    recovered: float | None = None  # by the fault's own measure (see the docstring)
    notes: list[str] = field(default_factory=list)


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
        self.second_worker = spawn(first.argv, self.stack.logs / "processors-2.log", env=env)

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
                        "preload": ["openai"]}}))

    # the faults

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

    def fault(self, name: str) -> Fault:
        down = self.args.down
        if name == "broker":
            victim = asyncio.run(calls_leader(self.broker.client_settings()))
            killed = time.time()
            self.broker.stop(force=True, node=victim)
            time.sleep(down)
            # Started again while the cluster still holds the killed node's registration (its session lasts
            # broker.session.timeout.ms, 9 s), the node cannot register (DuplicateBrokerRegistrationException)
            # yet the launcher's readiness probe counts the stale registration, provisioning fails on the node
            # and start() kills it again. So: wait until the cluster has fenced it, then start it.
            gone = wait_for(f"broker {victim} fenced", lambda: fenced(self.broker.client_settings(), victim), 60)
            waited = time.time() - killed
            self.broker.start()  # the killed node again, on its intact disk; returns once the cluster is ready
            back = time.time()
            fault = Fault(name, f"broker {victim} (leader of tether.calls/0)", killed, back, back)
            fault.notes.append(f"restarted {waited:.1f} s after the kill, once the cluster had fenced it"
                               if gone else "restarted without its fencing seen")
            return fault
        if name == "gateway-replica":
            killed = self._kill_service("gateway-1")
            time.sleep(down)
            self.stack.up()
            back = time.time()
            return Fault(name, "gateway-1 of 2", killed, back, back)
        if name == "processors":
            killed = self._kill_service("processors")
            time.sleep(down)
            self.stack.up()
            return Fault(name, "processors worker 1 of 2", killed, time.time())
        if name == "trainer":
            killed = self._kill_service("trainer")
            time.sleep(down)
            self.stack.up()
            return Fault(name, "trainer", killed, time.time())
        if name == "controller":
            assert self.controller is not None
            killed = time.time()
            self.controller.kill()
            self.controller.wait()
            time.sleep(down)
            self.start_controller()
            return Fault(name, "controller", killed, time.time())
        raise ValueError(name)

    def finish_recovery(self, fault: Fault) -> None:
        """Recovery by the fault's own measure, for those that come from the topics."""
        kinds: dict[str, type[Event]] = {"processors": TaskGroup, "trainer": WeightVersionPublished,
                                         "controller": RolloutStarted}
        kind = kinds.get(fault.name)
        if kind is not None:
            fault.recovered = self.monitor.first_after(kind, fault.killed)


async def calls_leader(bus: BusSettings) -> int:
    async with admin_client(bus) as admin:
        (calls,) = await admin.describe_topics([topics.CALLS.name])
    return int(next(p for p in calls["partitions"] if p["partition"] == 0)["leader"])


def fenced(bus: BusSettings, node: int) -> bool:
    """Whether the cluster no longer lists `node` among its brokers (False while it cannot tell: the admin
    client may have picked the dead node)."""
    async def listed() -> set[int]:
        async with admin_client(bus) as admin:
            found = await admin.describe_cluster()
        return {int(b["node_id"]) for b in found["brokers"]}

    try:
        return node not in asyncio.run(asyncio.wait_for(listed(), 10))
    except Exception:
        return False


def wait_for(what: str, done: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if done():
            return True
        time.sleep(0.5)
    console.print(f"[red]timed out waiting for {what}[/red]")
    return False


def live(run: Run) -> None:
    a = run.args
    stack = run.stack
    with console.status("three KRaft brokers..."):
        t = time.time()
        run.broker.start()
    console.print(f"Kafka: 3 brokers on {run.broker.bootstrap} ({time.time() - t:.0f} s)")
    with console.status("tether up: engine, 2 gateway replicas + HAProxy, processors, trainer..."):
        t = time.time()
        stack.up()
        run.start_second_worker()
    console.print(f"stack up ({time.time() - t:.0f} s); logs in {stack.logs}")
    run.monitor.start()
    run.write_controller_config()
    run.started = time.time()
    run.start_controller()
    console.print(f"controller started; warming up {a.warmup:.0f} s")
    time.sleep(a.warmup)
    for name in a.faults:
        with console.status(f"fault: {name}"):
            fault = run.fault(name)
        console.print(f"{fault.what}: killed at +{fault.killed - run.started:.1f} s, back after "
                      f"{fault.back - fault.killed:.1f} s{''.join(f'; {n}' for n in fault.notes)}; "
                      f"settling {a.settle:.0f} s")
        run.faults.append(fault)
        if run.second_worker is not None and run.second_worker.poll() is not None:
            console.print(f"[red]the second processors worker exited with {run.second_worker.returncode}[/red]")
        time.sleep(a.settle)
        run.finish_recovery(fault)
    run.stopped = time.time()
    assert run.controller is not None
    run.controller.send_signal(signal.SIGINT)  # it cancels the rollouts still running, then exits
    try:
        run.controller.wait(90)
    except subprocess.TimeoutExpired:
        console.print("[red]the controller did not stop within 90 s of SIGINT; killed[/red]")
        run.controller.kill()
    console.print(f"controller stopped at +{run.stopped - run.started:.0f} s; letting the processors catch up")
    time.sleep(a.tail)


# -- figures and checks -------------------------------------------------------------------------------------------


def read_calls(calls_dir: Path) -> list[dict[str, Any]]:
    calls = []
    for path in sorted(calls_dir.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                calls.append({**json.loads(line), "rollout": path.stem})
    return calls


def window(calls: list[dict[str, Any]], lo: float, hi: float) -> tuple[float, float | None, int]:
    """(ok calls/s, p99 latency of the ok calls in ms, calls failed) for calls ending in [lo, hi)."""
    inside = [c for c in calls if lo <= c["end"] < hi]
    ok = sorted(c["end"] - c["start"] for c in inside if c["status"] == "ok")
    p99 = ok[min(len(ok) - 1, int(0.99 * len(ok)))] * 1000 if ok else None
    return len(ok) / max(hi - lo, 1e-9), p99, sum(c["status"] != "ok" for c in inside)


def fault_table(run: Run, calls: list[dict[str, Any]]) -> Table:
    a = run.args
    span = min(a.settle, 20.0)
    table = Table(title=f"Faults under load: {a.concurrency} harnesses at once, a call every {a.interval} s, "
                        f"{a.turns} turns; SIGKILL, {a.down:.0f} s down, restart, {a.settle:.0f} s settle")
    for column in ("fault", "killed at", "back after", "recovered after", "first ok call after", "calls/s before",
                   "during", "after", "p99 ms before", "during", "after", "failed calls", "version"):
        table.add_column(column, justify="right")
    for f in run.faults:
        during_hi = max(f.back, f.killed + 1.0)
        before = window(calls, f.killed - span, f.killed)
        during = window(calls, f.killed, during_hi)
        after = window(calls, during_hi, during_hi + span)
        first_ok = min((c["end"] for c in calls if c["status"] == "ok" and c["start"] >= f.killed), default=None)
        failed = sum(c["status"] != "ok" for c in calls if f.killed <= c["end"] < during_hi + span)
        v0, v1 = run.monitor.version_at(f.killed), run.monitor.version_at(during_hi + a.settle)

        def ms(x: float | None) -> str:
            return "-" if x is None else f"{x:.0f}"

        table.add_row(f.what, f"+{f.killed - run.started:.0f} s", f"{f.back - f.killed:.1f} s",
                      "-" if f.recovered is None else f"{f.recovered - f.killed:.1f} s",
                      "-" if first_ok is None else f"{first_ok - f.killed:.2f} s",
                      f"{before[0]:.2f}", f"{during[0]:.2f}", f"{after[0]:.2f}",
                      ms(before[1]), ms(during[1]), ms(after[1]), str(failed), f"v{v0} → v{v1}")
    return table


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


def checks(run: Run, calls: list[dict[str, Any]]) -> tuple[list[Check], list[ModelCall]]:
    bus = run.broker.client_settings()
    run_id = run.settings.run_id
    events, rebuilt = asyncio.run(replay(bus, run_id, Policy()))
    groups = asyncio.run(_groups(bus, run_id))
    recorded = [e for e in events if isinstance(e, ModelCall)]
    out: list[Check] = []

    # every call a harness got a 200 for is on tether.calls exactly once
    by_id = Counter(json.loads(c.response_json).get("id") for c in recorded if c.status == "ok")
    acked = [c for c in calls if c["status"] == "ok"]
    missing = [c for c in acked if by_id[c["id"]] == 0]
    twice = [c for c in acked if by_id[c["id"]] > 1]
    unseen = len(set(by_id) - {c["id"] for c in acked})
    out.append(Check("acknowledged calls on tether.calls exactly once", not missing and not twice,
                     f"{len(acked)} calls answered 200 to the harnesses; {len(acked) - len(missing) - len(twice)} "
                     f"found once by response id, {len(missing)} missing, {len(twice)} more than once "
                     f"({len(recorded)} ModelCalls recorded, {unseen} ok ones no harness saw: a retried request "
                     f"or a call cut by the final stop)"
                     + (f"; missing e.g. {missing[:2]}" if missing else "")))
    per_rollout: dict[str, list[int]] = {}
    for c in recorded:
        per_rollout.setdefault(c.rollout_id, []).append(c.seq)
    bad_seqs = {r: sorted(s) for r, s in per_rollout.items() if sorted(s) != list(range(len(s)))}
    out.append(Check("each rollout's seqs unique and gapless", not bad_seqs,
                     f"{len(per_rollout)} rollouts with calls" + (f"; bad: {dict(list(bad_seqs.items())[:3])}"
                                                                  if bad_seqs else "")))
    failed_calls = [c for c in calls if c["status"] != "ok"]
    out.append(Check("no call failed as the harness saw it", not failed_calls,
                     f"{len(failed_calls)} of {len(calls)}" + (
                         f": {Counter(c['status'] for c in failed_calls).most_common()}; first "
                         f"{failed_calls[0]['rollout']} at +{failed_calls[0]['end'] - run.started:.1f} s: "
                         f"{failed_calls[0].get('error')}" if failed_calls else "")))

    # every rollout ends with a result, none failed because of the infrastructure
    started = {e.rollout_id for e in events if isinstance(e, RolloutStarted)}
    finished: dict[str, list[RolloutFinished]] = {}
    for e in events:
        if isinstance(e, RolloutFinished):
            finished.setdefault(e.rollout_id, []).append(e)
    unfinished = started - set(finished)
    stop = run.stopped
    statuses = Counter(fs[-1].status for fs in finished.values())
    by_bench = {r for r, fs in finished.items()
                if fs[-1].status == "cancelled" and fs[-1].finished_at.timestamp() >= stop}
    bad = {r: fs[-1] for r, fs in finished.items() if fs[-1].status != "succeeded" and r not in by_bench}
    repeated = {r: [f.status for f in fs] for r, fs in finished.items() if len(fs) > 1}
    out.append(Check("every rollout finished; none failed", not unfinished and not bad,
                     f"{len(started)} started; statuses {dict(statuses)} ({len(by_bench)} cancelled by the bench's "
                     f"final stop); {len(unfinished)} without a result"
                     + (f"; failed: {[(r, f.status, f.reason) for r, f in list(bad.items())[:4]]}" if bad else "")
                     + (f"; finished more than once: {dict(list(repeated.items())[:3])}" if repeated else "")))

    # task groups exactly once on tether.samples
    repeats = [g.group_id for g, again in groups if again]
    stored = [g for g, again in groups if not again]
    out.append(Check("task groups exactly once on tether.samples", not repeats,
                     f"{len(stored)} groups, {len(repeats)} repeated" + (f": {repeats[:4]}" if repeats else "")))

    # the replay equals what was trained; no group trained twice
    latest = checkpoint.latest(run.settings.run_dir / "checkpoints" / run_id)
    state = checkpoint.load_state(latest) if latest is not None else None
    trained = set(state.trained) if state is not None else set()
    same, pending = compare(rebuilt, stored)
    stored_trained = [g for g in stored if g.group_id in trained]
    rebuilt_trained = [g for g in rebuilt if g.group_id in trained]
    n_history = int(sum(h["task_groups"] for h in state.history)) if state is not None else 0
    hashes_equal = content_hash(stored_trained) == content_hash(rebuilt_trained)
    out.append(Check("replay hash equals what was trained", same and hashes_equal and trained <= {g.group_id for g
                                                                                                  in stored},
                     f"replay vs tether.samples: {'identical' if same else 'DIFFERENT'} over {len(stored)} groups "
                     f"(+{pending} still partial in the replay); the {len(trained)} trained groups: sha256 "
                     f"{content_hash(stored_trained)[:16]}... on tether.samples, "
                     f"{content_hash(rebuilt_trained)[:16]}... rebuilt"))
    out.append(Check("no group trained twice", n_history == len(trained),
                     f"{n_history} groups over {len(state.history) if state else 0} updates, {len(trained)} distinct"))

    # weight versions kept advancing across the faults
    versions = run.monitor.versions()
    stalled = [f.what for f in run.faults if run.monitor.version_at(max(f.back, f.killed + 1) + run.args.settle)
               <= run.monitor.version_at(f.killed)]
    aborted = sum(isinstance(e, UpdateAborted) for _, e in run.monitor.seen)
    out.append(Check("weight versions advanced across every fault", not stalled and bool(versions),
                     f"v{versions[0][1] if versions else '-'} → v{versions[-1][1] if versions else '-'} "
                     f"({len(versions)} published, {aborted} updates aborted; the bench's monitor read a version "
                     f"at most {run.monitor.lag():.1f} s after it was published)"
                     + (f"; no new version after: {stalled}" if stalled else "")))
    if run.monitor.error is not None:
        out.append(Check("the bench's topic monitor ran throughout", False, repr(run.monitor.error)))
    return out, recorded


async def _groups(bus: BusSettings, run_id: str) -> list[tuple[TaskGroup, bool]]:
    return [pair async for pair in read_groups(bus, run_id)]


def plot(run: Run, calls: list[dict[str, Any]], recorded: list[ModelCall], out: Path) -> None:
    plt = pyplot()
    t0, bin_s = run.started, 2.0
    end = max((c["end"] for c in calls), default=t0) - t0
    bins = [i * bin_s for i in range(int(end / bin_s) + 2)]
    ok = [c["end"] - t0 for c in calls if c["status"] == "ok"]
    gw = [c.timings.finished_at.timestamp() - t0 for c in recorded if c.status == "ok"]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    top.hist(ok, bins=bins, weights=[1 / bin_s] * len(ok), histtype="step", color="#3a7", label="harnesses: ok")
    top.hist(gw, bins=bins, weights=[1 / bin_s] * len(gw), histtype="step", color="#37a", linestyle="--",
             label="tether.calls: ok ModelCalls")
    bad = [c["end"] - t0 for c in calls if c["status"] != "ok"]
    if bad:
        top.plot(bad, [0] * len(bad), "rx", label="failed calls")
    top.set(ylabel="calls / s")
    top.legend(loc="upper right", fontsize=8)
    lat_bin = 5.0
    xs, p99s, p50s = [], [], []
    for i in range(int(end / lat_bin) + 1):
        lat = sorted((c["end"] - c["start"]) * 1000 for c in calls
                     if c["status"] == "ok" and i * lat_bin <= c["end"] - t0 < (i + 1) * lat_bin)
        if lat:
            xs.append((i + 0.5) * lat_bin)
            p99s.append(lat[min(len(lat) - 1, int(0.99 * len(lat)))])
            p50s.append(lat[len(lat) // 2])
    bottom.plot(xs, p99s, color="#a33", label="p99")
    bottom.plot(xs, p50s, color="#999", label="p50")
    bottom.set(yscale="log", ylabel="latency ms (harness, 5 s bins)", xlabel="seconds since the controller started")
    bottom.legend(loc="upper right", fontsize=8)
    for f in run.faults:
        for ax in (top, bottom):
            ax.axvspan(f.killed - t0, max(f.back, f.killed + 1) - t0, color="#f90", alpha=0.25)
        top.annotate(f.name, (f.killed - t0, top.get_ylim()[1] * 0.95), fontsize=7, rotation=90, va="top")
    fig.suptitle("chaos: SIGKILLs under load (orange: kill → restarted)")
    save(fig, out, console)


def main() -> None:
    parser = arguments(__doc__, "chaos.png")
    parser.add_argument("--faults", default=",".join(FAULTS), help="comma-separated, in order, of: "
                        + ", ".join(FAULTS))
    parser.add_argument("--warmup", type=float, default=30.0, help="seconds of load before the first fault")
    parser.add_argument("--settle", type=float, default=25.0, help="seconds after a part is back")
    parser.add_argument("--down", type=float, default=5.0, help="seconds a killed part stays down")
    parser.add_argument("--tail", type=float, default=10.0, help="seconds for the processors after the stop")
    parser.add_argument("--concurrency", type=int, default=4, help="harnesses at once")
    parser.add_argument("--group-size", type=int, default=2)
    parser.add_argument("--batch-groups", type=int, default=2, help="task groups per update")
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between a harness's calls")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--heap", default="384m", help="each broker's JVM heap")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder (logs, calls, checkpoints)")
    args = parser.parse_args()
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)  # a killed broker is expected here
    args.faults = [f.strip() for f in args.faults.split(",") if f.strip()]
    if unknown := set(args.faults) - set(FAULTS):
        parser.error(f"unknown faults {sorted(unknown)}; choose from {FAULTS}")

    scratch = Path(tempfile.mkdtemp(prefix="tether-chaos-"))
    base = free_port_block()
    broker = KafkaBroker(BrokerSettings(state_dir=scratch / "kafka", brokers=3, port=base, controller_port=base + 1,
                                        heap=args.heap, start_timeout_s=240))
    run_id = "chaos"
    settings = StackSettings(run_id=run_id, home=scratch / "home", model=init_tiny(scratch / "tiny"),
                             engine_port=free_port(), gateway_port=free_port(), gateway_replicas=2, trainer={
                                 "batch_groups": args.batch_groups, "max_staleness": 100, "zero_variance": "keep",
                                 "lr": 1e-4})
    stack = Stack(settings, broker=broker)
    calls_dir = scratch / "calls"
    calls_dir.mkdir()
    run = Run(args, scratch, broker, stack, Monitor(broker.client_settings(), run_id), calls_dir)
    try:
        live(run)
        calls = read_calls(calls_dir)
        with console.status("reading the run back from the topics..."):
            found, recorded = checks(run, calls)
    finally:
        run.monitor.stopping.set()
        if run.controller is not None and run.controller.poll() is None:
            run.controller.kill()
        if run.second_worker is not None:
            stop_group(run.second_worker.pid, 30)
        with console.status("tether down..."):
            stack.down(keep_kafka=True)
            broker.stop(force=True)
        if args.keep:
            console.print(f"kept: {scratch} (logs: {stack.logs}, harness calls: {calls_dir})")
        else:
            shutil.rmtree(scratch, ignore_errors=True)

    console.print(fault_table(run, calls))
    console.print("recovered: broker, replica = the part ready again; processors = next task group on "
                  "tether.samples; trainer = next version published; controller = next rollout launched.")
    summary = Table(title="checks after the run")
    for column in ("check", "", "detail"):
        summary.add_column(column)
    for c in found:
        summary.add_row(c.name, "[green]ok[/green]" if c.ok else "[red]FAILED[/red]", c.detail)
    console.print(summary)
    plot(run, calls, recorded, args.out)


if __name__ == "__main__":
    main()
