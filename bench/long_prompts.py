"""Harness-sized prompts on the embedded engine: prefill time and memory, with the prefix cache off and on.

    .venv/bin/python bench/long_prompts.py [--context 32768] [--lengths 8192 16384 28000]

Builds the tiny model at --context and starts `tether engine serve` twice, one
after the other: the prefix cache off (TETHER_ENGINE_PREFIX_CACHE_MB=0), then
on. Each gets the same token-id prompts with max_tokens 1, so a request's time
is its prefill: fresh prompts of each length; the longest one extended by 600
tokens (an agent's next call repeats the conversation and adds to it); and a
new prompt sharing all but its last 1,000 tokens with it (a new task under the
same long system prompt). Prints the seconds of each, the ratio off/on, and the
engine's peak RSS; writes bench/results/long_prompts.png.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

from infra.processes import free_port, stop, wait_healthy

from _shared import arguments, pyplot, save

console = Console(width=max(120, shutil.get_terminal_size().columns))


def cases(lengths: list[int], vocab: int, seed: int = 0) -> list[tuple[str, list[int]]]:
    """(name, prompt) in the order sent; every fresh prompt starts differently, so only the last two can hit."""
    rng = random.Random(seed)
    fresh = [(f"{n:,} tokens, fresh", [rng.randrange(vocab) for _ in range(n)]) for n in lengths]
    longest = fresh[-1][1]
    return [*fresh, ("+600 tokens (next call)", longest + [rng.randrange(vocab) for _ in range(600)]),
            ("same start, new last 1,000 (new task)", longest[:-1000] + [rng.randrange(vocab) for _ in range(1000)])]


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure(model: Path, prompts: list[tuple[str, list[int]]], cache_mb: int, scratch: Path
            ) -> tuple[dict[str, float], float]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "tether.cli", "engine", "serve", "--model", str(model), "--port", str(port)],
        env={**os.environ, "TETHER_ENGINE_PREFIX_CACHE_MB": str(cache_mb)},
        stdout=(scratch / f"engine-{cache_mb}.log").open("wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    seconds: dict[str, float] = {}
    try:
        wait_healthy(url, process, "the engine")
        for name, prompt in prompts:
            started = time.perf_counter()
            httpx.post(f"{url}/v1/completions", json={"model": str(model), "prompt": prompt, "max_tokens": 1},
                       timeout=600).raise_for_status()
            seconds[name] = time.perf_counter() - started
            console.print(f"cache {'on' if cache_mb else 'off'}: {name}: {seconds[name]:.2f} s")
        return seconds, peak_rss_mb(process.pid)
    finally:
        stop(process)


def main() -> None:
    parser = arguments(__doc__, "long_prompts.png")
    parser.add_argument("--context", type=int, default=32768)
    parser.add_argument("--lengths", type=int, nargs="+", default=[8192, 16384, 28000])
    args = parser.parse_args()
    if max(args.lengths) + 601 > args.context:
        parser.error("--lengths: the longest plus 600 tokens must fit --context")
    from tether.tiny_model import init_tiny

    scratch = Path(tempfile.mkdtemp(prefix="tether-long-prompts-"))
    try:
        with console.status("building the tiny model..."):
            model = init_tiny(scratch / "tiny", context=args.context)
        vocab = len(json.loads((model / "tokenizer.json").read_text())["model"]["vocab"])
        prompts = cases(sorted(args.lengths), vocab)
        off, off_rss = measure(model, prompts, 0, scratch)
        on, on_rss = measure(model, prompts, 512, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    table = Table(title=f"Prefill on the tiny model at a {args.context:,}-token context (max_tokens 1)")
    for column in ("prompt", "cache off s", "cache on s", "off / on"):
        table.add_column(column, justify="right")
    for name in off:
        table.add_row(name, f"{off[name]:.2f}", f"{on[name]:.2f}", f"{off[name] / on[name]:.1f}x")
    table.add_row("engine peak RSS MB", f"{off_rss:,.0f}", f"{on_rss:,.0f}", "")
    console.print(table)

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 3.8))
    names = list(off)
    xs = range(len(names))
    ax.bar([x - 0.2 for x in xs], [off[n] for n in names], 0.4, label="prefix cache off")
    ax.bar([x + 0.2 for x in xs], [on[n] for n in names], 0.4, label="prefix cache on")
    ax.set_xticks(list(xs), names, fontsize=8)
    ax.set_ylabel("seconds (prefill)")
    ax.set_title("Harness-sized prompts on the embedded engine")
    ax.legend()
    save(fig, args.out, console)


if __name__ == "__main__":
    main()
