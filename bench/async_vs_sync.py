"""The same workload trained synchronously and collocated-async, side by side in one run.

    .venv/bin/python bench/async_vs_sync.py [--updates 6] [--batch-groups 4] [--group-size 4] [--scale 1.0]

Both runs: the whole local stack on a broker of its own, the tiny model, the
same tasks and harness (bench/harnesses/heavy_tail.py: one model call, then a
Pareto-distributed stretch of work, then a reward; durations seeded by
rollout, so both runs see the same ones), the same number of updates and
batch size. Synchronous: the controller launches B groups, waits for all of
them and for the trainer's update, repeats (`sync_batch`). Async: the
controller keeps up to 3B groups in flight while the trainer updates every B.
Prints wall time, task groups trained per minute, the fraction of the time the
device sat idle (neither the engine generating, by its own count of time in
prefill and decode steps, nor the trainer updating), staleness, and the
throughput ratio; writes both timelines to bench/results/async_vs_sync.png.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml
from rich.console import Console
from rich.table import Table

from infra.kafka.launcher import KafkaBroker
from infra.processes import free_port
from tether.stack import Stack, StackSettings
from tether.tiny_model import init_tiny
from trainer import checkpoint

from _shared import arguments, pyplot, save, scratch_broker

console = Console(width=max(150, shutil.get_terminal_size().columns))
HARNESS = Path(__file__).parent / "harnesses" / "heavy_tail.py"


@dataclass(frozen=True)
class RunResult:
    mode: str
    wall: float
    groups: float
    busy: float  # the trainer's update steps
    generating: float  # the engine's prefill and decode steps
    staleness_mean: float
    staleness_max: float
    times: list[float]

    @property
    def per_minute(self) -> float:
        return self.groups / self.wall * 60


def _engine_busy(url: str) -> float:
    return float(httpx.get(f"{url}/health", timeout=30).json()["busy_s"])


def one_run(mode: str, home: Path, model: Path, broker: KafkaBroker, args: argparse.Namespace) -> RunResult:
    run_id = f"bench-{mode}"
    b, k, updates = args.batch_groups, args.group_size, args.updates
    settings = StackSettings(run_id=run_id, home=home, model=model, engine_port=free_port(),
                             gateway_port=free_port(), trainer={
                                 "batch_groups": b, "max_updates": updates, "max_staleness": 100,
                                 "zero_variance": "keep", "lr": 1e-4})
    stack = Stack(settings, broker=broker)
    run_dir = settings.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "tasks.jsonl").write_text("".join(json.dumps({"id": f"t{i}"}) + "\n" for i in range(b * updates)))
    (run_dir / "controller.yaml").write_text(yaml.safe_dump({
        "run_id": run_id, "dataset": "tasks.jsonl", "group_size": k, "concurrency": b * k * 3,
        "max_groups_in_flight": b * 3 if mode == "async" else b, "timeout_s": 300, "log_dir": "rollouts",
        **({"sync_batch": b} if mode == "sync" else {}),
        "harness": {"command": [sys.executable, str(HARNESS), "--scale", str(args.scale)]}, "sandbox": False}))
    env = {**os.environ, "TETHER_BUS_BOOTSTRAP_SERVERS": broker.bootstrap,
           "TETHER_CONTROLLER_GATEWAY_URL": settings.gateway_url,
           "TETHER_CONTROLLER_GATEWAY_ADMIN_KEY": settings.admin_key,
           "TETHER_CONTROLLER_GATEWAY_SECRET": settings.secret}
    try:
        with console.status(f"{mode}: tether up"):
            stack.up()
        busy_before = _engine_busy(settings.engine_url)
        started = time.time()
        with (run_dir / "controller.log").open("ab") as log:
            agents = subprocess.Popen([sys.executable, "-m", "tether.cli", "controller", "run",
                                       str(run_dir / "controller.yaml")], env=env, stdout=log,
                                      stderr=subprocess.STDOUT)
        history: list[dict[str, float]] = []
        with console.status(f"{mode}: {updates} updates of {b} groups x K={k}") as status:
            deadline = time.monotonic() + 1800
            while len(history) < updates and time.monotonic() < deadline:
                latest = checkpoint.latest(run_dir / "checkpoints" / run_id)
                if latest is not None:
                    history = checkpoint.load_state(latest).history
                status.update(f"{mode}: update {len(history)}/{updates}, {time.time() - started:.0f} s")
                time.sleep(0.5)
        wall = (history[-1]["time"] if history else time.time()) - started
        generating = _engine_busy(settings.engine_url) - busy_before  # the last update's tail included
        agents.send_signal(signal.SIGINT)
        agents.wait(120)
    finally:
        stack.down(keep_kafka=True)
    busy = sum(h["seconds"] for h in history)
    stale = [h["staleness_mean"] for h in history]
    return RunResult(mode, wall, sum(h["task_groups"] for h in history), busy, generating,
                     sum(stale) / max(len(stale), 1), max((h["staleness_max"] for h in history), default=0.0),
                     [h["time"] - started for h in history])


def main() -> None:
    parser = arguments(__doc__, "async_vs_sync.png")
    parser.add_argument("--updates", type=int, default=6)
    parser.add_argument("--batch-groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--scale", type=float, default=1.0, help="Pareto scale of a harness's work, seconds")
    parser.add_argument("--keep", action="store_true", help="Keep the runs' folders (logs, checkpoints) and say where")
    args = parser.parse_args()
    scratch, broker = scratch_broker("tether-async-bench-")
    try:
        model = init_tiny(scratch / "tiny")
        broker.start()
        results = [one_run(mode, scratch / "home", model, broker, args) for mode in ("sync", "async")]
    finally:
        broker.stop()
        if args.keep:
            console.print(f"logs and checkpoints kept in {scratch}/home/runs")
        else:
            shutil.rmtree(scratch, ignore_errors=True)

    table = Table(title=f"Sync vs collocated async: {args.updates} updates x {args.batch_groups} task groups, "
                        f"K={args.group_size}, Pareto(1.5) harness durations x {args.scale} s")
    for column in ("mode", "wall s", "task groups / min", "engine busy", "trainer busy", "device idle",
                   "staleness mean", "staleness max"):
        table.add_column(column, justify="right")
    for r in results:
        table.add_row(r.mode, f"{r.wall:.0f}", f"{r.per_minute:.1f}", f"{r.generating / r.wall:.0%}",
                      f"{r.busy / r.wall:.0%}", f"{max(0.0, 1 - (r.generating + r.busy) / r.wall):.0%}",
                      f"{r.staleness_mean:.2f}", f"{r.staleness_max:.0f}")
    console.print(table)
    sync, fast = results
    ratio = fast.per_minute / sync.per_minute
    console.print(f"throughput ratio async/sync: {ratio:.2f}x")

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for r, colour in zip(results, ("#999", "#3a7"), strict=True):
        ax.step([0.0, *r.times], list(range(len(r.times) + 1)), where="post", color=colour, label=r.mode)
    ax.set(xlabel="seconds since the agents started", ylabel="updates done",
           title=f"updates over time: async {ratio:.2f}x sync")
    ax.legend()
    save(fig, args.out, console)


if __name__ == "__main__":
    main()
