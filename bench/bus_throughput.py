"""Bus throughput for realistic ModelCall events: encode, produce (acks=all), consume+decode.

    .venv/bin/python bench/bus_throughput.py [--events 3000] [--bootstrap HOST:PORT]

Without --bootstrap it starts its own broker (the project's launcher, a temp
data dir, free ports) so the topic holds only this run's events. Prints events/s
and MB/s per stage and writes bench/results/bus_throughput.png.
"""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from schemas import topics
from schemas.admin import ensure_topics
from schemas.consumer import EventConsumer
from schemas.events import ModelCall, Sampling, Timings, Usage
from schemas.producer import EventProducer
from schemas.serde import decode, encode
from schemas.settings import BusSettings

from _shared import arguments, pyplot, save, scratch_broker

PROMPT_TOKENS, RESPONSE_TOKENS, VOCAB = 2000, 500, 151_000
console = Console(width=max(150, shutil.get_terminal_size().columns))  # tables stay whole in logs


@dataclass
class Stage:
    name: str
    events: int
    nbytes: int
    seconds: float

    @property
    def eps(self) -> float:
        return self.events / self.seconds

    @property
    def mbps(self) -> float:
        return self.nbytes / self.seconds / 1e6


def realistic_call(rng: random.Random, run_id: str, i: int) -> ModelCall:
    """A mid-rollout chat call: ~2,000 prompt tokens of conversation, 500 sampled tokens with logprobs."""
    words = ["the", "function", "returns", "None", "error", "file", "line", "def", "import", "test", "assert"]

    def turn(n: int) -> str:
        return " ".join(rng.choice(words) for _ in range(n))

    messages = [{"role": "system", "content": turn(60)}]
    for _ in range(8):
        messages += [{"role": "user", "content": turn(120)}, {"role": "assistant", "content": turn(80)}]
    request = {"model": "tiny", "messages": messages, "temperature": 1.0, "max_tokens": 512}
    answer = turn(350)
    response = {"id": f"chatcmpl-{i}", "object": "chat.completion", "model": "tiny",
                "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": answer}}],
                "usage": {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": RESPONSE_TOKENS}}
    now = datetime.now(UTC)
    return ModelCall(
        call_id=f"{run_id}-{i}", rollout_id=f"{run_id}-r{i // 8}", run_id=run_id, gateway_id="gw-0", seq=i % 8,
        api="openai.chat",
        model="tiny", request_json=json.dumps(request), response_json=json.dumps(response),
        prompt_token_ids=[rng.randrange(VOCAB) for _ in range(PROMPT_TOKENS)],
        response_token_ids=[rng.randrange(VOCAB) for _ in range(RESPONSE_TOKENS)],
        response_logprobs=[-rng.expovariate(2.0) for _ in range(RESPONSE_TOKENS)],
        weight_version=3, sampling=Sampling(temperature=1.0, top_p=1.0, max_tokens=512),
        usage=Usage(prompt_tokens=PROMPT_TOKENS, completion_tokens=RESPONSE_TOKENS),
        timings=Timings(received_at=now, finished_at=now, queued_ms=0.0, engine_ms=250.0), finish_reason="stop",
    )


def progress() -> Progress:
    return Progress(TextColumn("{task.description:<28}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console)


async def measure(bus: BusSettings, calls: list[ModelCall]) -> list[Stage]:
    await ensure_topics(bus, [topics.CALLS, topics.DEADLETTER])
    run_id = calls[0].run_id
    n = len(calls)
    stages: list[Stage] = []
    with progress() as bar:
        task = bar.add_task("encode", total=n)
        t0 = time.perf_counter()
        blobs = []
        for call in calls:
            blobs.append(encode(call))
            bar.advance(task)
        stages.append(Stage("encode only", n, sum(map(len, blobs)), time.perf_counter() - t0))

        task = bar.add_task("decode only", total=n)
        t0 = time.perf_counter()
        for blob in blobs:
            decode(blob)
            bar.advance(task)
        stages.append(Stage("decode only", n, sum(map(len, blobs)), time.perf_counter() - t0))

        sizes = [len(b) for b in blobs]
        async with EventProducer(bus) as producer:
            k = max(1, min(500, n // 4))  # latency-bound: each publish waits for its acknowledgement
            task = bar.add_task("produce, one in flight", total=k)
            t0 = time.perf_counter()
            for call in calls[:k]:
                await producer.publish(call)
                bar.advance(task)
            stages.append(Stage("produce (encode+send, 1 in flight)", k, sum(sizes[:k]), time.perf_counter() - t0))

            task = bar.add_task("produce, pipelined", total=n - k)
            t0 = time.perf_counter()
            for start in range(k, n, 200):
                chunk = calls[start:start + 200]
                await producer.publish_many(chunk)
                bar.advance(task, len(chunk))
            stages.append(Stage("produce (encode+send, 200 in flight)", n - k, sum(sizes[k:]),
                                time.perf_counter() - t0))

            task = bar.add_task("consume + decode", total=n)
            t0, got = time.perf_counter(), 0
            async with EventConsumer(bus, [topics.CALLS], producer) as consumer:
                async for batch in consumer.batches(timeout_ms=500, max_records=500):
                    mine = sum(1 for r in batch if isinstance(r.event, ModelCall) and r.event.run_id == run_id)
                    got += mine
                    bar.advance(task, mine)
                    if got >= n:
                        break
            stages.append(Stage("consume + decode", got, sum(sizes), time.perf_counter() - t0))
    return stages


def report(stages: list[Stage], event_bytes: float, out: Path) -> None:
    table = Table(title=f"ModelCall: {PROMPT_TOKENS} prompt + {RESPONSE_TOKENS} response tokens, "
                        f"{event_bytes / 1024:.1f} KiB encoded")
    for column in ("stage", "events", "seconds", "events/s", "MB/s"):
        table.add_column(column, justify="left" if column == "stage" else "right")
    for s in stages:
        table.add_row(s.name, str(s.events), f"{s.seconds:.2f}", f"{s.eps:,.0f}", f"{s.mbps:,.1f}")
    console.print(table)

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.barh([s.name for s in stages][::-1], [s.eps for s in stages][::-1], color="#4c72b0")
    for y, s in enumerate(stages[::-1]):
        ax.text(s.eps, y, f" {s.eps:,.0f}/s  {s.mbps:,.0f} MB/s", va="center", fontsize=8)
    ax.set_xlabel("events per second")
    ax.set_title("Tether bus throughput (realistic ModelCall, one process, 2-core box)", fontsize=10)
    ax.set_xlim(0, max(s.eps for s in stages) * 1.45)
    save(fig, out, console)


def main() -> None:
    parser = arguments(__doc__, "bus_throughput.png")
    parser.add_argument("--events", type=int, default=3000)
    parser.add_argument("--bootstrap", help="use this broker instead of starting one")
    args = parser.parse_args()
    if args.events < 2:
        parser.error("--events must be at least 2")

    rng = random.Random(0)
    run_id = f"bench-{uuid.uuid4().hex[:8]}"
    with console.status("building events..."):
        calls = [realistic_call(rng, run_id, i) for i in range(args.events)]
    event_bytes = sum(len(encode(c)) for c in calls[:50]) / min(50, len(calls))

    broker, state = None, None
    if args.bootstrap:
        bus = BusSettings(bootstrap_servers=args.bootstrap)
    else:
        state, broker = scratch_broker("tether-bench-")
        with console.status("starting a broker for the benchmark..."):
            broker.start()
        bus = BusSettings(bootstrap_servers=broker.bootstrap)
    try:
        stages = asyncio.run(measure(bus, calls))
    finally:
        if broker is not None:
            broker.stop()
        if state is not None:
            shutil.rmtree(state, ignore_errors=True)
    report(stages, event_bytes, args.out)


if __name__ == "__main__":
    main()
