"""What an episode's length costs: bytes on tether.calls, processor CPU, join rate, lag and replay, by calls per
episode, with calls recorded as deltas (the gateway's default) and whole, side by side; then the join with two
processor workers against one.

    .venv/bin/python bench/episode_scaling.py [--lengths 1 10 50 100] [--groups 4] [--step-tokens 240]
                                              [--record deltas whole] [--scale-calls 6000] [--sink]

Episodes as a harness makes them, through the real gateway (FakeVLLM as the
engine, the tiny model's tokenizer at a 32k context), Kafka and `tether
processors run`: each call's prompt is the previous prompt, the previous
answer and a tool output of about --step-tokens tokens, after a system prompt
of about 1,000 (so 100 calls end near 30k tokens). The bench plays the
controller: it announces each rollout, seals it through the gateway and
reports its end. Per episode length and way of recording (a gateway with
TETHER_GATEWAY_EXTENDABLE_CALLS=0 records every call whole), --groups task
groups of K=2:

- bytes per episode on tether.calls (the encoded ModelCall events), and that
  over what the final context alone takes: the last call's whole prompt and
  response as int32 ids, a float32 logprob for each token the episode
  generated, and the last request's text (the whole conversation);
- lag from a group's last RolloutFinished to its TaskGroup, p50 and p99;
- joined calls/s and processor CPU per call: the same events again under new
  ids (as many copies as make --join-calls calls, within --join-mb), encoded
  first, then published at once while the processor runs. The rate is taken
  once the backlog is all on the topics (the calls of the groups that came out
  after that, over the time they took): the processor's steady rate. "live
  CPU ms/call" is the processor's CPU over the live phase, where calls come at
  the harness's pace;
- replay of the run from the topics: the run's events/s and MB/s. The topics
  hold the shorter lengths' runs too, as a cluster's hold other runs; replay
  passes over their records undecoded (each names its run in a header), so
  these figures are of a small run among others. "Replay at scale" is of a run
  that is most of what the topics hold: the 10-call episodes again under new
  rollout ids of one run (--replay-events events), read as `tether replay`
  reads.

The analytics sink is off (--sink runs it: chdb inside the processor, whose
inserts then take most of its CPU).

Then scale-out, on the 10-call episodes recorded as deltas: --scale-calls calls
drained as above (joined calls/s), and published again at half the rate one
worker joined (lag from a group's last event acknowledged to its TaskGroup),
with one processor worker, then with a second one of the same app sharing the
partitions.

Prints the tables; writes bench/results/episode_scaling.{png,json}.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table
from transformers import AutoTokenizer

from infra.processes import stop
from schemas import topics
from schemas.admin import admin_client
from schemas.consumer import EventConsumer
from schemas.events import Event, ModelCall, RolloutStarted
from schemas.producer import EventProducer
from schemas.serde import encode
from schemas.settings import BusSettings
from stream_processors.grouping import Policy
from stream_processors.replay import read_run_events, replay

from _episodes import REPLY, Harness, K, Watch, cpu_seconds, drain, final_context_bytes, pct, renamed
from _shared import (
    arguments,
    kafka_and_processors,
    pyplot,
    save,
    start_engine,
    start_gateway,
    start_processor,
)

console = Console(width=max(130, shutil.get_terminal_size().columns))
async def measure(length: int, way: str, args: Any, bus: BusSettings, gateway: str, tokenizer: Any,
                  processor: Any, watch: Watch) -> tuple[dict[str, Any], list[Event]]:
    run_id = f"scale-{way}-{length}"
    groups = [f"{run_id}.g{g}" for g in range(args.groups)]
    async with EventProducer(bus) as producer, httpx.AsyncClient(timeout=120) as client:
        harness = Harness(gateway, producer, tokenizer, args.step_tokens, seed=length)
        cpu_before, started = cpu_seconds(processor.pid), time.perf_counter()
        finished: dict[str, float] = {}
        for gid in groups:  # a group's K episodes at once, groups one after another
            ends = await asyncio.gather(*(harness.episode(client, run_id, gid, f"{gid}.r{k}", length, float(k))
                                          for k in range(K)))
            finished[gid] = max(ends)
        await watch.until(groups)
        cpu = cpu_seconds(processor.pid) - cpu_before
        live_s = time.perf_counter() - started
        lags = [(watch.arrived[g] - finished[g]) * 1000 for g in groups]

        events = await read_run_events(bus, run_id)
        calls = [e for e in events if isinstance(e, ModelCall)]
        sizes: dict[str, int] = {}
        for c in calls:
            sizes[c.rollout_id] = sizes.get(c.rollout_id, 0) + len(encode(c))
        per_episode = statistics.fmean(sizes.values())
        final = final_context_bytes(calls)

        started = time.perf_counter()  # before the copies below are on the topics: they would be read too
        read, rebuilt = await replay(bus, run_id, Policy())
        replay_s = time.perf_counter() - started
        assert len(rebuilt) == len(groups), (len(rebuilt), len(groups))

        copies = max(1, min(args.join_copies, -(-args.join_calls // len(calls)),  # enough calls to time a rate
                            int(args.join_mb * 1e6 // sum(len(encode(c)) for c in calls))))
        again = [renamed(e, f"-again{i}") for i in range(copies) for e in events]
        joined, joined_cpu, published_s = await drain(producer, [processor], again,
                                                      [f"{g}-again{i}" for i in range(copies) for g in groups],
                                                      watch)

    prompts = [c.usage.prompt_tokens for c in calls]
    return {"calls/episode": length, "recorded": way, "final prompt tokens": float(max(prompts)),
            "KB/episode": per_episode / 1024, "x final context": per_episode / final,
            "processor CPU ms/call": joined_cpu * 1000 / (copies * len(calls)),
            "processor CPU ms/event": joined_cpu * 1000 / (copies * len(events)),
            "live CPU ms/call": cpu * 1000 / len(calls), "lag p50 ms": pct(lags, 0.5),
            "lag p99 ms": pct(lags, 0.99), "joined calls/s": joined,
            "replay events/s": len(read) / replay_s,
            "replay MB/s": sum(len(encode(e)) for e in read) / 1e6 / replay_s, "live s": live_s,
            "join backlog published s": published_s}, events


async def run_all(args: Any, bus: BusSettings, model: Path, processor: Any, scratch: Path
                  ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    tokenizer = AutoTokenizer.from_pretrained(model)
    watch = Watch(bus)
    watcher = asyncio.create_task(watch.run())
    await asyncio.sleep(2.0)  # at the end of tether.samples before anything is published
    rows: list[dict[str, Any]] = []
    scaling: list[dict[str, Any]] = []
    replayed: dict[str, Any] = {}
    engine, engine_process = start_engine("fake", model, (REPLY,), scratch)
    try:
        gateway, gateway_process = start_gateway(engine, model, bus, "scale-warm", scratch)
        try:  # the processors' first group (their start-up) out of the figures
            async with EventProducer(bus) as producer, httpx.AsyncClient(timeout=120) as client:
                harness = Harness(gateway, producer, tokenizer, args.step_tokens, seed=0)
                await asyncio.gather(*(harness.episode(client, "scale-warm", "scale-warm.g0", f"scale-warm.g0.r{k}",
                                                       2, float(k)) for k in range(K)))
            await watch.until(["scale-warm.g0"])
        finally:
            stop(gateway_process)
        ten: list[Event] = []
        for length in args.lengths:
            for way in args.record:
                env = {"TETHER_GATEWAY_EXTENDABLE_CALLS": "0"} if way == "whole" else {}
                gateway, gateway_process = start_gateway(engine, model, bus, f"scale-{way}-{length}", scratch, env)
                try:
                    row, events = await measure(length, way, args, bus, gateway, tokenizer, processor, watch)
                finally:
                    stop(gateway_process)
                rows.append(row)
                if length == 10 and way == "deltas":
                    ten = events
                    if args.replay_events:  # before the longer runs fill the topics
                        replayed = await replay_at_scale(args, bus, ten, watch)
                console.print(" ".join(f"{k} {v:,.1f}" if isinstance(v, float) else f"{k} {v}"
                                       for k, v in row.items()))
        if ten and args.scale_calls:
            scaling = await scale_out(args, bus, scratch, processor, watch, ten)
    finally:
        stop(engine_process)
        watch.stopping.set()
        await watcher
    return rows, scaling, replayed


async def replay_at_scale(args: Any, bus: BusSettings, events: list[Event], watch: Watch) -> dict[str, Any]:
    """`tether replay`'s work on a run that is most of what the topics hold: the 10-call episodes (deltas) again
    under new rollout ids of one run, about --replay-events events. The per-length replay figures above are of a
    small run among the others' records."""
    copies = max(1, args.replay_events // len(events))
    run_id = "scale-replay"
    groups = sorted({e.group_id for e in events if isinstance(e, RolloutStarted)})
    async with EventProducer(bus) as producer:
        ours = [dataclasses.replace(e, run_id=run_id) for e in events]  # type: ignore[arg-type]
        await producer.publish_many([renamed(e, f"-r{i}", run=False) for i in range(copies) for e in ours])
    await watch.until([f"{g}-r{i}" for i in range(copies) for g in groups])  # the processor is done with them
    async with EventProducer(bus) as dlq, EventConsumer(bus, [topics.CALLS, topics.ROLLOUTS], dlq) as consumer:
        records = sum((await consumer.end_offsets()).values())  # the topics are new: they begin at 0
    cpu, started = time.process_time(), time.perf_counter()
    read, rebuilt = await replay(bus, run_id, Policy())  # what `tether replay` runs
    replay_s, replay_cpu = time.perf_counter() - started, time.process_time() - cpu
    assert len(rebuilt) == copies * len(groups)
    row = {"events": float(len(read)), "replay events/s": len(read) / replay_s,
           "replay MB/s": sum(len(encode(e)) for e in read) / 1e6 / replay_s,
           "replay CPU us/event": replay_cpu * 1e6 / len(read), "records on the topics": float(records),
           "records scanned/s": records / replay_s}
    console.print(" ".join(f"{k} {v:,.1f}" for k, v in row.items()))
    return row


async def workers_sharing(bus: BusSettings, app_id: str, n: int, timeout_s: float = 120) -> None:
    """Until the processors' consumer group is stable with `n` members."""
    deadline = time.perf_counter() + timeout_s
    async with admin_client(bus) as admin:
        while time.perf_counter() < deadline:
            (described,) = await admin.describe_consumer_groups([app_id])
            (group,) = described.groups
            state, members = group[2], group[5]
            if state == "Stable" and len(members) == n:
                return
            await asyncio.sleep(0.5)
    raise SystemExit(f"the processors never shared their partitions {n} ways")


async def scale_out(args: Any, bus: BusSettings, scratch: Path, first: Any, watch: Watch, events: list[Event]
                    ) -> list[dict[str, Any]]:
    """Joined calls/s (a burst) and lag (at a steady rate) with one processor worker, then two."""
    calls = sum(isinstance(e, ModelCall) for e in events)
    groups = sorted({e.group_id for e in events if isinstance(e, RolloutStarted)})
    copies = max(1, -(-args.scale_calls // calls))
    out: list[dict[str, Any]] = []
    workers = [first]
    try:
        for n in (1, 2):
            if n == 2:
                workers.append(start_processor(bus, scratch, worker=1, sink=args.sink))
                await workers_sharing(bus, "tether-processor", 2)
                async with EventProducer(bus) as producer:  # both past their tables' recovery: a run goes through
                    await producer.publish_many([renamed(e, "-w2probe") for e in events])
                await watch.until([f"{g}-w2probe" for g in groups])
            async with EventProducer(bus) as producer:
                burst = [renamed(e, f"-w{n}b{i}") for i in range(copies) for e in events]
                rate, cpu, published_s = await drain(producer, workers, burst,
                                                     [f"{g}-w{n}b{i}" for i in range(copies) for g in groups], watch)
                # lag at half of what one worker joined: a group's events every `gap` seconds
                gap = calls / len(groups) / (out[0]["calls joined/s"] / 2 if out else rate / 2)
                finished: dict[str, float] = {}
                for i in range(max(1, int(args.paced_s / gap))):
                    gid = groups[i % len(groups)]
                    suffix = f"-w{n}p{i}"
                    await producer.publish_many([renamed(e, suffix) for e in events
                                                 if getattr(e, "rollout_id", "").startswith(gid + ".")])
                    finished[gid + suffix] = time.perf_counter()
                    await asyncio.sleep(max(0.0, gap - (time.perf_counter() - finished[gid + suffix])))
                await watch.until(list(finished))
            lags = [(watch.arrived[g] - t) * 1000 for g, t in finished.items()]
            out.append({"workers": n, "calls joined/s": rate, "processor CPU ms/call": cpu * 1000 / (copies * calls),
                        "paced calls/s": calls / len(groups) / gap, "lag p50 ms": pct(lags, 0.5),
                        "lag p99 ms": pct(lags, 0.99), "burst published s": published_s})
            console.print(" ".join(f"{k} {v:,.1f}" for k, v in out[-1].items()))
    finally:
        for w in workers[1:]:
            w.terminate()
            w.wait(60)
    return out


def main() -> None:
    parser = arguments(__doc__, "episode_scaling.png")
    parser.add_argument("--lengths", type=int, nargs="+", default=[1, 10, 50, 100])
    parser.add_argument("--groups", type=int, default=4, help="task groups (of K=2) per length")
    parser.add_argument("--record", nargs="+", choices=["deltas", "whole"], default=["deltas", "whole"])
    parser.add_argument("--join-calls", type=int, default=6000, help="calls to publish again for the join rate")
    parser.add_argument("--join-mb", type=float, default=200, help="at most this many MB of them")
    parser.add_argument("--join-copies", type=int, default=1000, help="at most this many copies of the run for it")
    parser.add_argument("--step-tokens", type=int, default=240, help="tokens of tool output added per call")
    parser.add_argument("--scale-calls", type=int, default=6000, help="calls per burst of the scale-out (0: none)")
    parser.add_argument("--sink", action="store_true",
                        help="the analytics sink on (chdb in process: its inserts and merges dwarf the join's work)")
    parser.add_argument("--replay-events", type=int, default=20000,
                        help="events of the run replayed at scale (0: none)")
    parser.add_argument("--paced-s", type=float, default=15.0, help="seconds of paced publishing for the lag")
    args = parser.parse_args()
    if 1100 + max(args.lengths) * (args.step_tokens * 1.1 + 40) > 32768:  # text re-encodes a little longer
        parser.error("the longest episode would not fit a 32k context: fewer --lengths or --step-tokens")
    from tether.tiny_model import init_tiny

    with kafka_and_processors("tether-episode-bench-", sink=args.sink) as (scratch, bus, processor):
        model = init_tiny(scratch / "tiny", context=32768)
        rows, scaling, replayed = asyncio.run(run_all(args, bus, model, processor, scratch))

    title = f"Episode length: {args.groups} groups x K={K} per length and way, through gateway, Kafka, processors"
    print_table(title, rows)
    if replayed:
        print_table("Replay at scale: the 10-call episodes (deltas), copies under one run", [replayed])
    if scaling:
        print_table("Scale-out: the 10-call episodes (deltas), one processor worker, then two", scaling)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    figures = {"lengths": rows, "replay": replayed, "scale_out": scaling}
    args.out.with_suffix(".json").write_text(json.dumps(figures, indent=1))
    plot(rows, args.out)


#: figures kept in the JSON, not printed: they say how the measurement went, not what it measured
QUIET = ("final prompt tokens", "live s", "join backlog published s", "burst published s")


def print_table(title: str, rows: list[dict[str, Any]]) -> None:
    table = Table(title=title)
    columns = [c for c in rows[0] if c not in QUIET]
    for column in columns:
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(*[f"{row[c]:,.1f}" if isinstance(row[c], float) else str(row[c]) for c in columns])
    console.print(table)


def plot(rows: list[dict[str, Any]], out: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.6))
    panels = (("KB/episode", "KB on tether.calls per episode"), ("processor CPU ms/call", "processor CPU ms per call"),
              ("joined calls/s", "calls joined per second"), ("lag p50 ms", "seal → task group, ms (p50, p99 dashed)"))
    for ax, (key, title) in zip(axes, panels, strict=True):
        for way in dict.fromkeys(r["recorded"] for r in rows):
            mine = [r for r in rows if r["recorded"] == way]
            lengths = [r["calls/episode"] for r in mine]
            (line,) = ax.plot(lengths, [r[key] for r in mine], "o-", label=way)
            if key == "lag p50 ms":
                ax.plot(lengths, [r["lag p99 ms"] for r in mine], "o--", color=line.get_color())
        ax.set(title=title, xlabel="calls per episode", xscale="log")
        if key == "KB/episode":
            ax.set_yscale("log")
        ax.legend()
    save(fig, out, console)


if __name__ == "__main__":
    main()
