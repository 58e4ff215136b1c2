"""Engine throughput on the tiny model: generated tokens/s for 1, 8 and 32 concurrent requests, in the normal mode
and in the deterministic one (TETHER_ENGINE_DETERMINISTIC: every sequence prefilled and decoded alone).

    .venv/bin/python bench/engine_throughput.py [--model DIR] [--tokens 128] [--rounds 2]
        [--modes normal deterministic]

Starts `tether engine serve` as its own process per mode (building the tiny
model in a temp dir unless --model is given), sends non-streaming requests
over HTTP with ignore_eos so every request generates the same number of
tokens, and reports the ratio of 32-concurrent to sequential throughput and
each level's deterministic throughput against the normal one, measured in the
same run. Writes bench/results/engine_throughput.png.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from infra.processes import free_port, stop, wait_healthy

from _shared import arguments, pyplot, save

console = Console(width=max(150, shutil.get_terminal_size().columns))  # tables stay whole in logs
LEVELS = (1, 8, 32)
MODES = ("normal", "deterministic")


async def run_level(url: str, model: str, concurrency: int, tokens: int, requests: int) -> float:
    """Tokens/s with `concurrency` clients each sending requests back to back until `requests` are done."""
    left = requests
    generated = 0

    async def client(http: httpx.AsyncClient, i: int) -> None:
        nonlocal left, generated
        while left > 0:
            left -= 1
            r = await http.post("/v1/completions", json={"model": model, "prompt": f"task {i}: the function",
                                                         "max_tokens": tokens, "ignore_eos": True, "seed": i})
            r.raise_for_status()
            generated += r.json()["usage"]["completion_tokens"]

    async with httpx.AsyncClient(base_url=url, timeout=600) as http:
        await http.post("/v1/completions", json={"model": model, "prompt": "warm", "max_tokens": 4})
        t0 = time.perf_counter()
        await asyncio.gather(*[client(http, i) for i in range(concurrency)])
        return generated / (time.perf_counter() - t0)


def main() -> None:
    parser = arguments(__doc__, "engine_throughput.png")
    parser.add_argument("--model", type=Path, help="model directory (default: build the tiny model)")
    parser.add_argument("--tokens", type=int, default=128, help="tokens generated per request")
    parser.add_argument("--rounds", type=int, default=2, help="requests per client at each level")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    args = parser.parse_args()
    if args.tokens < 1 or args.rounds < 1:
        parser.error("--tokens and --rounds must be at least 1")

    model, scratch = args.model, None
    if model is None:
        from tether.tiny_model import init_tiny

        scratch = Path(tempfile.mkdtemp(prefix="tether-tiny-"))
        with console.status("building the tiny model..."):
            model = init_tiny(scratch / "tiny")
    results: dict[str, dict[int, float]] = {}
    try:
        with Progress(console=console) as bar:
            task = bar.add_task("modes and concurrency levels", total=len(LEVELS) * len(args.modes))
            for mode in args.modes:
                results[mode] = measure(model, mode, args.tokens, args.rounds, lambda: bar.advance(task))
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    report(results, args.tokens, args.out)


def measure(model: Path, mode: str, tokens: int, rounds: int, advance: Callable[[], None]) -> dict[int, float]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "TETHER_ENGINE_DETERMINISTIC": str(mode == "deterministic").lower()}
    server = subprocess.Popen([sys.executable, "-m", "tether.cli", "engine", "serve", "--model", str(model),
                               "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        wait_healthy(url, server, "the engine")
        results: dict[int, float] = {}
        for level in LEVELS:
            results[level] = asyncio.run(run_level(url, str(model), level, tokens, level * rounds))
            advance()
        return results
    finally:
        stop(server)


def report(results: dict[str, dict[int, float]], tokens: int, out: Path) -> None:
    modes = list(results)
    table = Table(title=f"Embedded engine, tiny model, {tokens} tokens per request")
    table.add_column("concurrent requests", justify="right")
    for mode in modes:
        table.add_column(f"{mode} tokens/s", justify="right")
        table.add_column(f"{mode} vs sequential", justify="right")
    if len(modes) == 2:
        table.add_column(f"{modes[1]} / {modes[0]}", justify="right")
    for level in LEVELS:
        row = [str(level)]
        for mode in modes:
            row += [f"{results[mode][level]:,.0f}", f"{results[mode][level] / results[mode][1]:.1f}x"]
        if len(modes) == 2:
            row.append(f"{results[modes[1]][level] / results[modes[0]][level]:.2f}x")
        table.add_row(*row)
    console.print(table)
    for mode in modes:
        console.print(f"{mode}: ratio at 32 concurrent vs sequential {results[mode][32] / results[mode][1]:.1f}x")

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 3.5))
    width = 0.8 / len(modes)
    colors = {"normal": "#55a868", "deterministic": "#4c72b0"}
    for m, mode in enumerate(modes):
        xs = [i + (m - (len(modes) - 1) / 2) * width for i in range(len(LEVELS))]
        values = [results[mode][level] for level in LEVELS]
        ax.bar(xs, values, width, label=mode, color=colors[mode])
        for x, v in zip(xs, values, strict=True):
            ax.text(x, v, f"{v:,.0f}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(LEVELS)), [str(level) for level in LEVELS])
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel("generated tokens / s")
    ax.set_ylim(0, max(v for r in results.values() for v in r.values()) * 1.25)
    ax.legend(fontsize=8)
    ax.set_title("Tether embedded engine throughput (tiny model, CPU)", fontsize=10)
    save(fig, out, console)


if __name__ == "__main__":
    main()
