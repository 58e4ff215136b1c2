"""How fast the controller launches rollouts, and what it costs per rollout, with a trivial harness.

    .venv/bin/python bench/controller_launch.py [--tasks 100] [--group-size 4] [--concurrency 16]

Side by side in one run: (a) the same processes the run needs (a `true`
harness and an `echo 1` reward command per rollout) spawned directly with the
same concurrency, nothing else; (b) the controller running them as rollouts
through the local runner, with everything a rollout involves: registering at
a real gateway, RolloutStarted and RolloutFinished acknowledged by Kafka, the
log file, the seal, the reward. The gateway answers from FakeVLLM, though no
harness here calls it. Prints rollouts/s for both, the controller's added
wall time and its CPU time per rollout.

Then a Python harness that imports the openai SDK and exits, through the
controller twice: spawned per rollout, and forked from a zygote that
preloaded the SDK (`harness.preload`). Writes bench/results/controller_launch.png.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import shutil
import subprocess
import sys
import time

from rich.console import Console
from rich.table import Table

from controller.config import RunConfig
from controller.main import run
from controller.settings import ControllerSettings
from infra.processes import free_port, stop, wait_healthy
from schemas.admin import ensure_topics
from schemas.settings import BusSettings

from _shared import arguments, pyplot, save, scratch_broker

console = Console(width=max(150, shutil.get_terminal_size().columns))
SECRET, ADMIN = "bench-secret-key", "bench-admin-key"


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def direct(n: int, concurrency: int) -> float:
    """The processes alone: harness then reward command, `concurrency` at a time."""
    slots = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with slots:
            for argv in (["true"], ["echo", "1"]):
                p = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.DEVNULL)
                await p.wait()

    started = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n)))
    return time.perf_counter() - started


def main() -> None:
    parser = arguments(__doc__, "controller_launch.png")
    parser.add_argument("--tasks", type=int, default=100)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--sdk-tasks", type=int, default=16, help="Tasks (x K) of the openai-SDK harness runs")
    args = parser.parse_args()
    n = args.tasks * args.group_size

    scratch, broker = scratch_broker("tether-controller-bench-")
    processes: list[subprocess.Popen[bytes]] = []
    try:
        with console.status("starting Kafka, FakeVLLM and the gateway..."):
            from tether.tiny_model import init_tiny

            tiny = init_tiny(scratch / "tiny")
            broker.start()
            bus = BusSettings(bootstrap_servers=broker.bootstrap)
            asyncio.run(ensure_topics(bus))
            engine_port, gateway_port = free_port(), free_port()
            engine, gateway = f"http://127.0.0.1:{engine_port}", f"http://127.0.0.1:{gateway_port}"
            processes.append(subprocess.Popen(
                [sys.executable, "-m", "tests.fakes.vllm", "--tokenizer", str(tiny), "--port", str(engine_port),
                 "--reply", "ok"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            wait_healthy(engine, processes[-1], "FakeVLLM")
            processes.append(subprocess.Popen(
                [sys.executable, "-m", "tether.cli", "gateway", "serve", "--engine", engine, "--tokenizer", str(tiny),
                 "--port", str(gateway_port), "--run-id", "bench"],
                env={**os.environ, "TETHER_BUS_BOOTSTRAP_SERVERS": broker.bootstrap,
                     "TETHER_GATEWAY_SECRET": SECRET, "TETHER_GATEWAY_ADMIN_KEY": ADMIN},
                stdout=(scratch / "gateway.log").open("wb"), stderr=subprocess.STDOUT))
            wait_healthy(gateway, processes[-1], "the gateway")

        with console.status(f"spawning {n} harness+reward process pairs directly..."):
            direct_s = asyncio.run(direct(n, args.concurrency))
        (scratch / "tasks.jsonl").write_text("".join(json.dumps({"id": f"t{i}"}) + "\n" for i in range(args.tasks)))
        config = RunConfig.model_validate({
            "run_id": f"bench-{int(time.time())}", "dataset": scratch / "tasks.jsonl",
            "group_size": args.group_size, "concurrency": args.concurrency, "max_groups_in_flight": args.tasks,
            "harness": {"command": ["true"]}, "reward": {"source": "command", "command": ["echo", "1"]},
            "log_dir": scratch / "logs", "sandbox": False})
        settings = ControllerSettings(gateway_url=gateway, gateway_admin_key=ADMIN, gateway_secret=SECRET, bus=bus)
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

        with Progress(*Progress.get_default_columns()[:1], BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console) as bar:
            task = bar.add_task("rollouts through the controller", total=n)
            cpu0, started = cpu_s(), time.perf_counter()
            view = asyncio.run(run(config, settings, lambda c: bar.update(
                task, completed=sum(1 for s in c.state.rollouts.values() if s.finished))))
            controller_s, controller_cpu = time.perf_counter() - started, cpu_s() - cpu0
        sdk: dict[str, float] = {}
        for mode, preload in (("spawned", []), ("preloaded", ["openai"])):
            (scratch / "sdk.jsonl").write_text("".join(json.dumps({"id": f"t{i}"}) + "\n"
                                                       for i in range(args.sdk_tasks)))
            sdk_config = config.model_copy(update={
                "run_id": f"bench-sdk-{mode}-{int(time.time())}", "dataset": scratch / "sdk.jsonl",
                "harness": config.harness.model_copy(update={"command": [sys.executable, "-c", "import openai"],
                                                             "preload": preload})})
            with console.status(f"openai-SDK harness, {mode}..."):
                started = time.perf_counter()
                sdk_view = asyncio.run(run(sdk_config, settings))
                sdk[mode] = time.perf_counter() - started
            assert {s.finished.status for s in sdk_view.rollouts.values() if s.finished} == {"succeeded"}
    finally:
        for p in processes:
            stop(p)
        broker.stop()
        shutil.rmtree(scratch, ignore_errors=True)

    statuses = {s.finished.status for s in view.rollouts.values() if s.finished}
    assert len(view.rollouts) == n and statuses == {"succeeded"}, statuses
    table = Table(title=f"{n} rollouts ({args.tasks} tasks x K={args.group_size}), concurrency {args.concurrency}")
    for column in ("path", "seconds", "rollouts/s", "per rollout"):
        table.add_column(column, justify="right")
    table.add_row("processes alone", f"{direct_s:.2f}", f"{n / direct_s:,.0f}", f"{direct_s / n * 1000:.1f} ms")
    table.add_row("through the controller", f"{controller_s:.2f}", f"{n / controller_s:,.0f}",
                  f"{controller_s / n * 1000:.1f} ms")
    console.print(table)
    n_sdk = args.sdk_tasks * args.group_size
    sdk_table = Table(title=f"{n_sdk} rollouts of `python -c 'import openai'` through the controller")
    for column in ("harness start", "seconds", "rollouts/s", "per rollout"):
        sdk_table.add_column(column, justify="right")
    for mode, seconds in sdk.items():
        sdk_table.add_row(mode, f"{seconds:.2f}", f"{n_sdk / seconds:,.1f}", f"{seconds / n_sdk * 1000:.0f} ms")
    console.print(sdk_table)
    console.print(f"preloaded vs spawned: {sdk['spawned'] / sdk['preloaded']:.1f}x the rollouts per second")
    console.print(f"controller added {(controller_s - direct_s) / n * 1000:.1f} ms wall per rollout; "
                  f"its CPU time: {controller_cpu / n * 1000:.1f} ms per rollout (both processes' spawning "
                  f"included), ratio {controller_s / direct_s:.2f}x")

    plt = pyplot()
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 3.5))
    ax.bar(["processes alone", "through the controller"], [n / direct_s, n / controller_s], color=["#999", "#3a7"])
    ax.set_ylabel("rollouts / s")
    ax.set_title(f"Launch rate, trivial harness, concurrency {args.concurrency}")
    ax2.bar(list(sdk), [n_sdk / v for v in sdk.values()], color=["#999", "#3a7"])
    ax2.set_ylabel("rollouts / s")
    ax2.set_title("A harness importing the openai SDK")
    save(fig, args.out, console)


if __name__ == "__main__":
    main()
