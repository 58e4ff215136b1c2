"""Engine throughput on the tiny model: generated tokens/s for 1, 8 and 32 concurrent requests.

    .venv/bin/python bench/engine_throughput.py [--model DIR] [--tokens 128] [--rounds 2]

Starts `tether engine serve` as its own process (building the tiny model in a
temp dir unless --model is given), sends non-streaming requests over HTTP with
ignore_eos so every request generates the same number of tokens, and reports
the ratio of 32-concurrent to sequential throughput, measured in the same run.
Writes bench/results/engine_throughput.png.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from infra.processes import free_port, stop, wait_healthy

from _shared import arguments, pyplot, save

console = Console(width=max(150, shutil.get_terminal_size().columns))  # tables stay whole in logs
LEVELS = (1, 8, 32)


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
    args = parser.parse_args()
    if args.tokens < 1 or args.rounds < 1:
        parser.error("--tokens and --rounds must be at least 1")

    model, scratch = args.model, None
    if model is None:
        from tether.tiny_model import init_tiny

        scratch = Path(tempfile.mkdtemp(prefix="tether-tiny-"))
        with console.status("building the tiny model..."):
            model = init_tiny(scratch / "tiny")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "tether.cli", "engine", "serve", "--model", str(model),
                               "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with console.status("starting the engine..."):
            wait_healthy(url, server, "the engine")
        results: dict[int, float] = {}
        with Progress(console=console) as bar:
            task = bar.add_task("concurrency levels", total=len(LEVELS))
            for level in LEVELS:
                results[level] = asyncio.run(run_level(url, str(model), level, args.tokens, level * args.rounds))
                bar.advance(task)
    finally:
        stop(server)
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)

    table = Table(title=f"Embedded engine, tiny model, {args.tokens} tokens per request")
    for column in ("concurrent requests", "tokens/s", "vs sequential"):
        table.add_column(column, justify="right")
    for level, tps in results.items():
        table.add_row(str(level), f"{tps:,.0f}", f"{tps / results[1]:.1f}x")
    console.print(table)
    console.print(f"ratio at 32 concurrent vs sequential: {results[32] / results[1]:.1f}x (target: at least 10x)")

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar([str(k) for k in results], list(results.values()), color="#55a868")
    for i, tps in enumerate(results.values()):
        ax.text(i, tps, f"{tps:,.0f}\n({tps / results[1]:.1f}x)", ha="center", va="bottom", fontsize=8)
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel("generated tokens / s")
    ax.set_ylim(0, max(results.values()) * 1.25)
    ax.set_title("Tether embedded engine throughput (tiny model, CPU)", fontsize=10)
    save(fig, args.out, console)


if __name__ == "__main__":
    main()
