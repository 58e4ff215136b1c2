"""Load through an HTTP endpoint, and what it cost the process serving it: the benches of the gateway share it."""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp


@dataclass
class Result:
    latencies: list[float]
    seconds: float

    @property
    def p50(self) -> float:
        return statistics.median(self.latencies) * 1000

    @property
    def mean(self) -> float:
        return statistics.fmean(self.latencies) * 1000

    @property
    def p99(self) -> float:
        return sorted(self.latencies)[int(0.99 * (len(self.latencies) - 1))] * 1000

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.seconds


async def load(url: str | list[str], bodies: list[dict[str, Any]], headers: list[dict[str, str]], concurrency: int,
               stream: bool) -> Result:
    """`concurrency` clients send the bodies back to back; latency is until the last byte. `url`: one, or one per
    body in turn (a gateway that takes the rollout in its path)."""
    urls = [url] if isinstance(url, str) else url
    latencies: list[float] = []
    queue = list(range(len(bodies)))
    connector = aiohttp.TCPConnector(limit=concurrency * 2)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def client() -> None:
            while queue:
                i = queue.pop()
                started = time.perf_counter()
                to = urls[i % len(urls)]
                async with session.post(to, json={**bodies[i], "stream": stream}, headers=headers[i]) as r:
                    if r.status != 200:
                        raise SystemExit(f"{to} answered {r.status}: {await r.text()}")
                    await r.read()
                latencies.append(time.perf_counter() - started)

        t0 = time.perf_counter()
        await asyncio.gather(*[client() for _ in range(concurrency)])
        return Result(latencies, time.perf_counter() - t0)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0
