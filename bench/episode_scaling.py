"""What an episode's length costs: bytes on tether.calls, processor CPU, join rate, lag and replay, by calls per
episode.

    .venv/bin/python bench/episode_scaling.py [--lengths 1 10 50 100] [--groups 4] [--step-tokens 240]

Episodes as a harness makes them, through the real gateway (FakeVLLM as the
engine, the tiny model's tokenizer at a 32k context), Kafka and `tether
processors run`: each call's prompt is the previous prompt, the previous
answer and a tool output of about --step-tokens tokens, after a system prompt
of about 1,000 (so 100 calls end near 30k tokens). The bench plays the
controller: it announces each rollout, seals it through the gateway and
reports its end. Per episode length, --groups task groups of K=2:

- bytes per episode on tether.calls (the encoded ModelCall events), and that
  over the last call's own event (the final context alone);
- processor CPU per call (its process's user+system time over the phase);
- lag from a group's last RolloutFinished to its TaskGroup, p50 and p99;
- joined calls/s: the same events published again, as fast as the producer
  goes, under new ids (as many copies as make --join-calls calls), until
  every group is out;
- replay of the run from the topics: the run's events/s and MB/s. The topics
  hold the shorter lengths' runs and their copies too, as a cluster's hold
  other runs, and replay reads past them: later lengths read more.

Prints the table; writes bench/results/episode_scaling.{png,json}.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import random
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
from schemas.consumer import EventConsumer
from schemas.events import Event, ModelCall, RolloutFinished, RolloutSealed, RolloutStarted, TaskGroup
from schemas.producer import EventProducer
from schemas.rollout_token import mint
from schemas.serde import encode
from schemas.settings import BusSettings
from stream_processors.grouping import Policy
from stream_processors.replay import read_run_events, replay

from _shared import (
    ADMIN,
    SECRET,
    arguments,
    kafka_and_processors,
    pyplot,
    save,
    start_engine,
    start_gateway,
)

console = Console(width=max(130, shutil.get_terminal_size().columns))
K = 2
REPLY = "I will run the failing test again and read what it prints before I change anything in the code."


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


class Watch:
    """TaskGroups as they reach tether.samples, with the time each first arrived."""

    def __init__(self, bus: BusSettings) -> None:
        self.bus, self.arrived, self.stopping = bus, dict[str, float](), asyncio.Event()

    async def run(self) -> None:
        async with EventProducer(self.bus) as dlq, EventConsumer(self.bus, [topics.SAMPLES], dlq, name="bench-watch",
                                                                 from_beginning=False) as consumer:
            async for batch in consumer.batches(timeout_ms=50):
                now = time.perf_counter()
                for r in batch:
                    if isinstance(r.event, TaskGroup):
                        self.arrived.setdefault(r.event.group_id, now)
                if self.stopping.is_set():
                    return

    async def until(self, group_ids: list[str], timeout_s: float = 300) -> None:
        deadline = time.perf_counter() + timeout_s
        while not all(g in self.arrived for g in group_ids):
            if time.perf_counter() > deadline:
                raise SystemExit(f"groups never came: {[g for g in group_ids if g not in self.arrived][:3]}")
            await asyncio.sleep(0.05)


class Harness:
    """Episodes through the gateway, with what the controller would publish around them."""

    def __init__(self, gateway: str, producer: EventProducer, tokenizer: Any, step_tokens: int, seed: int) -> None:
        self.gateway, self.producer, self.tokenizer = gateway, producer, tokenizer
        self.step_tokens, self.rng = step_tokens, random.Random(seed)
        self.system = self.text(1000)

    def text(self, tokens: int) -> str:
        vocab = self.tokenizer.vocab_size
        return str(self.tokenizer.decode([self.rng.randrange(300, vocab) for _ in range(tokens)]))

    async def episode(self, client: httpx.AsyncClient, run_id: str, group_id: str, rollout_id: str, calls: int,
                      reward: float) -> float:
        """The episode; returns when its RolloutFinished was acknowledged."""
        (await client.post(f"{self.gateway}/admin/rollouts", json={"rollout_id": rollout_id},
                           headers={"authorization": f"Bearer {ADMIN}"})).raise_for_status()
        await self.producer.publish(RolloutStarted(rollout_id=rollout_id, run_id=run_id, group_id=group_id,
                                                   task_id=group_id, task_json="{}", group_size=K))
        auth = {"authorization": f"Bearer {mint(rollout_id, SECRET)}"}
        messages = [{"role": "system", "content": self.system}, {"role": "user", "content": "Fix the failing test."}]
        for _ in range(calls):
            r = await client.post(f"{self.gateway}/v1/chat/completions", headers=auth,
                                  json={"model": "m", "messages": messages, "max_tokens": 64})
            r.raise_for_status()
            messages += [{"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]},
                         {"role": "user", "content": self.text(self.step_tokens)}]
        (await client.post(f"{self.gateway}/admin/rollouts/{rollout_id}/seal",
                           headers={"authorization": f"Bearer {ADMIN}"}, timeout=60)).raise_for_status()
        await self.producer.publish(RolloutFinished(rollout_id=rollout_id, run_id=run_id, status="succeeded",
                                                    duration_s=1.0, exit_code=0, reward=reward))
        return time.perf_counter()


def renamed(event: Event, suffix: str) -> Event:
    """The event under new ids: a second copy of the run that the processors join from scratch."""
    fields = {f.name for f in dataclasses.fields(event)}
    changes: dict[str, Any] = {name: getattr(event, name) + suffix
                               for name in ("run_id", "rollout_id", "call_id", "group_id") if name in fields}
    if isinstance(event, RolloutSealed):
        changes["call_ids"] = [c + suffix for c in event.call_ids]
    return dataclasses.replace(event, **changes)


async def measure(length: int, args: Any, bus: BusSettings, gateway: str, tokenizer: Any, processor: int,
                  watch: Watch) -> dict[str, float]:
    run_id = f"scale-{length}"
    groups = [f"{run_id}.g{g}" for g in range(args.groups)]
    async with EventProducer(bus) as producer, httpx.AsyncClient(timeout=120) as client:
        harness = Harness(gateway, producer, tokenizer, args.step_tokens, seed=length)
        cpu_before, started = cpu_seconds(processor), time.perf_counter()
        finished: dict[str, float] = {}
        for gid in groups:  # a group's K episodes at once, groups one after another
            ends = await asyncio.gather(*(harness.episode(client, run_id, gid, f"{gid}.r{k}", length, float(k))
                                          for k in range(K)))
            finished[gid] = max(ends)
        await watch.until(groups)
        cpu = cpu_seconds(processor) - cpu_before
        live_s = time.perf_counter() - started
        lags = [(watch.arrived[g] - finished[g]) * 1000 for g in groups]

        events = await read_run_events(bus, run_id)
        calls = [e for e in events if isinstance(e, ModelCall)]
        sizes: dict[str, list[int]] = {}
        for c in sorted(calls, key=lambda c: c.seq):
            sizes.setdefault(c.rollout_id, []).append(len(encode(c)))
        per_episode = statistics.fmean(sum(s) for s in sizes.values())
        final = statistics.fmean(s[-1] for s in sizes.values())

        started = time.perf_counter()  # before the copies below are on the topics: they would be read too
        read, rebuilt = await replay(bus, run_id, Policy())
        replay_s = time.perf_counter() - started
        assert len(rebuilt) == len(groups), (len(rebuilt), len(groups))

        copies = max(1, min(args.join_copies, -(-args.join_calls // len(calls))))  # enough calls to time a rate
        again = [renamed(e, f"-again{i}") for i in range(copies) for e in events]
        started = time.perf_counter()
        await producer.publish_many(again)
        await watch.until([f"{g}-again{i}" for i in range(copies) for g in groups])
        joined_s = time.perf_counter() - started

    prompts = [len(c.prompt_token_ids) for c in calls]
    return {"calls/episode": length, "final prompt tokens": float(max(prompts)),
            "KB/episode": per_episode / 1024, "x final call": per_episode / final,
            "processor CPU ms/call": cpu * 1000 / len(calls), "lag p50 ms": pct(lags, 0.5),
            "lag p99 ms": pct(lags, 0.99), "joined calls/s": copies * len(calls) / joined_s,
            "replay events/s": len(read) / replay_s,
            "replay MB/s": sum(len(encode(e)) for e in read) / 1e6 / replay_s, "live s": live_s}


async def run_all(args: Any, bus: BusSettings, model: Path, processor: int, scratch: Path
                  ) -> list[dict[str, float]]:
    tokenizer = AutoTokenizer.from_pretrained(model)
    watch = Watch(bus)
    watcher = asyncio.create_task(watch.run())
    await asyncio.sleep(2.0)  # at the end of tether.samples before anything is published
    rows = []
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
        for length in args.lengths:
            gateway, gateway_process = start_gateway(engine, model, bus, f"scale-{length}", scratch)
            try:
                rows.append(await measure(length, args, bus, gateway, tokenizer, processor, watch))
            finally:
                stop(gateway_process)
            console.print(" ".join(f"{k} {v:,.1f}" for k, v in rows[-1].items()))
    finally:
        stop(engine_process)
        watch.stopping.set()
        await watcher
    return rows


def main() -> None:
    parser = arguments(__doc__, "episode_scaling.png")
    parser.add_argument("--lengths", type=int, nargs="+", default=[1, 10, 50, 100])
    parser.add_argument("--groups", type=int, default=4, help="task groups (of K=2) per length")
    parser.add_argument("--join-calls", type=int, default=2000, help="calls to publish again for the join rate")
    parser.add_argument("--join-copies", type=int, default=100, help="at most this many copies of the run for it")
    parser.add_argument("--step-tokens", type=int, default=240, help="tokens of tool output added per call")
    args = parser.parse_args()
    if 1100 + max(args.lengths) * (args.step_tokens * 1.1 + 40) > 32768:  # text re-encodes a little longer
        parser.error("the longest episode would not fit a 32k context: fewer --lengths or --step-tokens")
    from trainer.tiny_model import init_tiny

    with kafka_and_processors("tether-episode-bench-") as (scratch, bus, processor):
        model = init_tiny(scratch / "tiny", context=32768)
        rows = asyncio.run(run_all(args, bus, model, processor.pid, scratch))

    table = Table(title=f"Episode length: {args.groups} groups x K={K} per length, through gateway, Kafka, processors")
    for column in rows[0]:
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(*[f"{v:,.1f}" for v in row.values()])
    console.print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    plot(rows, args.out)


def plot(rows: list[dict[str, float]], out: Path) -> None:
    plt = pyplot()
    lengths = [r["calls/episode"] for r in rows]
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.6))
    panels = (("KB/episode", "KB on tether.calls per episode"), ("processor CPU ms/call", "processor CPU ms per call"),
              ("joined calls/s", "calls joined per second"), ("lag p50 ms", "seal → task group, ms"))
    for ax, (key, title) in zip(axes, panels, strict=True):
        ax.plot(lengths, [r[key] for r in rows], "o-")
        if key == "lag p50 ms":
            ax.plot(lengths, [r["lag p99 ms"] for r in rows], "o--", label="p99")
            ax.legend(["p50", "p99"])
        ax.set(title=title, xlabel="calls per episode", xscale="log")
    save(fig, out, console)


if __name__ == "__main__":
    main()
