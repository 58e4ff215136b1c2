"""The stream processors under load: synthetic calls and rollouts through the real broker and `tether processors run`.

    .venv/bin/python bench/pipeline_throughput.py [--groups 60] [--group-size 4] [--lag-groups 30] [--rate 2]

Phases, one run: (1) throughput: --groups task groups published as fast as
the producer goes (several calls per rollout, prompts of ~1,500 tokens that
extend from call to call, responses up to 200), timed until every group is on
tether.samples: calls joined/s and groups emitted/s; (2) lag: --lag-groups
more groups at --rate groups/s, each group's lag from its last event acknowledged to its
TaskGroup on tether.samples, p50/p99; (3) replay: the same topics read and
rebuilt by `stream_processors.replay`, events/s. The processor runs as its own
process with the analytics sink on (chdb). Writes bench/results/pipeline_throughput.png.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from schemas import topics
from schemas.consumer import EventConsumer
from schemas.events import Event, ModelCall, TaskGroup
from schemas.producer import EventProducer
from schemas.settings import BusSettings
from stream_processors.grouping import Policy
from stream_processors.replay import replay

from _shared import arguments, kafka_and_processors, pyplot, save

sys.path.insert(0, str(Path(__file__).parent.parent))  # the synthetic run generator lives with the tests
from tests.factories import synthetic_run

console = Console(width=max(150, shutil.get_terminal_size().columns))


def run_events(run_id: str, groups: int, k: int, seed: int) -> list[Event]:
    return synthetic_run(run_id, groups, k, calls=(3, 6), seed=seed, prompt_tokens=1500, response_tokens=200,
                         failing=0.05)


def by_group(events: list[Event]) -> list[list[Event]]:
    """A group's events together, as its rollouts would produce them."""
    groups: dict[str, list[Event]] = {}
    for e in events:
        gid = e.rollout_id.rsplit(".", 2)[0]  # type: ignore[union-attr]  # synthetic ids: RUN.TASK.rK.a0
        groups.setdefault(gid, []).append(e)
    return list(groups.values())


async def watch_samples(bus: BusSettings, arrivals: dict[str, float], stop: asyncio.Event) -> None:
    async with EventProducer(bus) as dlq, EventConsumer(bus, [topics.SAMPLES], dlq, name="bench-watch",
                                                        from_beginning=False) as consumer:
        async for batch in consumer.batches(timeout_ms=50):
            now = time.perf_counter()
            for r in batch:
                if isinstance(r.event, TaskGroup):
                    arrivals.setdefault(r.event.group_id, now)
            if stop.is_set():
                return


async def bench(bus: BusSettings, args: argparse.Namespace, progress: Progress) -> dict[str, float | list[float]]:
    arrivals: dict[str, float] = {}
    stop = asyncio.Event()
    watcher = asyncio.create_task(watch_samples(bus, arrivals, stop))
    await asyncio.sleep(2.0)  # the watcher is at the end of the topic before anything is published
    results: dict[str, float | list[float]] = {}
    async with EventProducer(bus) as producer:
        warm = run_events("bench-warm", 1, args.group_size, 0)
        await producer.publish_many(warm)
        task = progress.add_task("processor start-up (one warm-up group)", total=1)
        while "bench-warm.task0" not in arrivals:  # noqa: ASYNC110  # filled by the watcher task
            await asyncio.sleep(0.2)
        progress.update(task, completed=1)

        events = run_events("bench-load", args.groups, args.group_size, 1)
        calls = sum(isinstance(e, ModelCall) for e in events)
        task = progress.add_task(f"throughput: {args.groups} groups, {calls} calls", total=args.groups)
        started = time.perf_counter()
        await producer.publish_many(events)
        published = time.perf_counter()
        while (done := sum(g.startswith("bench-load.") for g in arrivals)) < args.groups:
            progress.update(task, completed=done)
            await asyncio.sleep(0.1)
        finished = max(t for g, t in arrivals.items() if g.startswith("bench-load."))
        progress.update(task, completed=args.groups)
        results.update(calls=calls, seconds=finished - started, publish_s=published - started,
                       events=len(events), bytes_mb=sum(len(e.prompt_token_ids) + len(e.response_token_ids)
                                                        for e in events if isinstance(e, ModelCall)) * 5 / 1e6)

        lag_events = by_group(run_events("bench-lag", args.lag_groups, args.group_size, 2))
        task = progress.add_task(f"lag: {args.lag_groups} groups at {args.rate}/s", total=args.lag_groups)
        sent: dict[str, float] = {}
        for group in lag_events:
            tick = time.perf_counter()
            await producer.publish_many(group)
            sent[group[0].rollout_id.rsplit(".", 2)[0]] = time.perf_counter()  # type: ignore[union-attr]
            progress.advance(task)
            await asyncio.sleep(max(0.0, 1.0 / args.rate - (time.perf_counter() - tick)))
        deadline = time.perf_counter() + 120
        while not all(g in arrivals for g in sent) and time.perf_counter() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.1)
        results["lags_ms"] = [(arrivals[g] - t) * 1000 for g, t in sent.items() if g in arrivals]
    stop.set()
    await watcher

    task = progress.add_task("replay of bench-load", total=None)
    started = time.perf_counter()
    read, groups = await replay(bus, "bench-load", Policy())
    results["replay_s"] = time.perf_counter() - started
    results["replay_events"] = len(read)
    progress.update(task, total=1, completed=1)
    assert len(groups) == args.groups, len(groups)
    return results


def main() -> None:
    parser = arguments(__doc__, "pipeline_throughput.png")
    parser.add_argument("--groups", type=int, default=60)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--lag-groups", type=int, default=30)
    parser.add_argument("--rate", type=float, default=2.0, help="groups per second in the lag phase")
    args = parser.parse_args()

    with kafka_and_processors("tether-pipeline-bench-") as (_, bus, _), Progress(console=console) as progress:
        r = asyncio.run(bench(bus, args, progress))

    lags = sorted(r["lags_ms"])  # type: ignore[arg-type]
    seconds, calls = float(r["seconds"]), float(r["calls"])  # type: ignore[arg-type]
    p99 = lags[min(len(lags) - 1, round(0.99 * (len(lags) - 1)))]
    table = Table(title=f"Stream processors: {args.groups} groups x K={args.group_size}, then {args.lag_groups} "
                        f"at {args.rate}/s (processor with the chdb sink on)")
    for column in ("figure", "value"):
        table.add_column(column)
    table.add_row("calls joined / s", f"{calls / seconds:,.0f}  ({calls:.0f} calls in {seconds:.1f} s; "
                                      f"publishing took {float(r['publish_s']):.1f} s)")  # type: ignore[arg-type]
    table.add_row("task groups emitted / s", f"{args.groups / seconds:,.1f}")
    table.add_row("end-to-end lag p50 / p99", f"{statistics.median(lags):,.0f} ms / {p99:,.0f} ms "
                                              f"({len(lags)} groups)")
    table.add_row("replay events / s", f"{float(r['replay_events']) / float(r['replay_s']):,.0f}  "  # type: ignore[arg-type]
                                       f"({r['replay_events']} events in {float(r['replay_s']):.1f} s)")  # type: ignore[arg-type]
    console.print(table)

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.hist(lags, bins=20, color="#3a7")
    ax.set(title="calls → TaskGroup lag per group", xlabel="ms", ylabel="groups")
    save(fig, args.out, console)


if __name__ == "__main__":
    main()
