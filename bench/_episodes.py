"""The parts of bench/episode_scaling.py that make and time episodes: a harness playing the controller, the watch on
tether.samples, event copies under new ids, and a backlog drained by the processors."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import statistics
import time
from pathlib import Path
from typing import Any

import httpx

from schemas import topics
from schemas.calls import whole
from schemas.consumer import EventConsumer
from schemas.events import Event, ModelCall, RolloutFinished, RolloutSealed, RolloutStarted, TaskGroup
from schemas.producer import EventProducer, run_headers
from schemas.rollout_token import mint
from schemas.serde import encode
from schemas.settings import BusSettings
from schemas.topics import key_for, topic_for

from _shared import ADMIN, SECRET

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


def renamed(event: Event, suffix: str, run: bool = True) -> Event:
    """The event under new ids: a second copy of the run that the processors join from scratch (with not `run`,
    more of the same run)."""
    fields = {f.name for f in dataclasses.fields(event)}
    names = ("run_id", "rollout_id", "call_id", "group_id") if run else ("rollout_id", "call_id", "group_id")
    changes: dict[str, Any] = {name: getattr(event, name) + suffix for name in names if name in fields}
    if isinstance(event, RolloutSealed):
        changes["call_ids"] = [c + suffix for c in event.call_ids]
    if isinstance(event, ModelCall) and event.extends is not None:
        changes["extends"] = event.extends + suffix
    return dataclasses.replace(event, **changes)


def final_context_bytes(calls: list[ModelCall]) -> float:
    """What one episode's final context takes alone, per episode on average: its last call's whole prompt and
    response as int32 ids, a float32 logprob per generated token, and its last request's text."""
    episodes: dict[str, list[ModelCall]] = {}
    for c in whole(calls):
        episodes.setdefault(c.rollout_id, []).append(c)
    sizes = []
    for episode in episodes.values():
        last = max(episode, key=lambda c: c.seq)
        generated = sum(len(c.response_token_ids) for c in episode)
        sizes.append(4 * (len(last.prompt_token_ids) + len(last.response_token_ids)) + 4 * generated
                     + len(last.request_json.encode()))
    return statistics.fmean(sizes)


async def drain(producer: EventProducer, workers: list[Any], backlog: list[Event], group_ids: list[str],
                watch: Watch) -> tuple[float, float, float]:
    """Calls joined per second, the workers' CPU seconds, and the seconds the bench took to publish `backlog`.

    The backlog is encoded before the clock starts and published at once while the workers run. The rate is
    taken once it is all on the topics: the calls of the groups that came out after that, over the time they
    took, so it is the processors' steady rate, neither the bench producer's nor their wake-up's."""
    records = [(topic_for(e).name, key_for(e), encode(e)) for e in backlog]
    headers = [run_headers(e) for e in backlog]
    calls_per_group = sum(isinstance(e, ModelCall) for e in backlog) / len(group_ids)
    cpu_before = sum(cpu_seconds(w.pid) for w in workers)
    started = time.perf_counter()
    await producer.send_many(records, headers)
    published = time.perf_counter()
    await watch.until(group_ids)
    cpu = sum(cpu_seconds(w.pid) for w in workers) - cpu_before
    after = [watch.arrived[g] for g in group_ids if watch.arrived[g] > published]
    if len(after) < len(group_ids) / 2:
        raise SystemExit(f"the processors joined most of the backlog while it was published ({len(after)} of "
                         f"{len(group_ids)} groups after): publish more (--join-calls, --scale-calls)")
    return len(after) * calls_per_group / (max(after) - published), cpu, published - started
