"""Tether's gateway beside Agent Lightning 1.0's, in one run against one instant fake engine: the latency each
adds, the calls per second each passes, its CPU per call and its memory as calls accumulate.

    .venv/bin/python bench/peer_gateway.py [--requests 5000] [--repeats 3] [--levels 1 16 64] \
        [--memory-calls 50000] [--peer-python PYTHON]

Agent Lightning (`agentlightning` 1.0.x from PyPI) goes into a virtual
environment of its own under .tether/peers/ (it needs Python 3.12 or newer:
--peer-python, else the first found on PATH or under pyenv), and its gateway
is started as `agl-server` starts it (bench/peers/agentlightning_gateway.py).
Both forward to FakeVLLM (tests/fakes/vllm.py), which answers at once in
vLLM's wire format: Agent Lightning sends the chat call on as it is
(`/v1/chat/completions` with `return_token_ids` and `logprobs`) and keeps it
in its in-memory store; Tether renders it, sends the token ids to
`/v1/completions`, and answers once Kafka has acknowledged the call's record
(acks=all). Plain calls only: Agent Lightning 1.0 refuses to stream.

For each level of concurrent clients and each repetition, the same calls go
straight to FakeVLLM's chat route, through Agent Lightning and through
Tether, one after the other; the table gives the median over repetitions of
each figure. Tether's row also gives its mean wait for Kafka's
acknowledgements per call (from its /metrics): the part of its added time that
is the write to the log before the answer. Then --memory-calls calls through
each gateway at 64 clients, with its resident memory after a tenth of them and
after all. The targets
(issue 34): Tether's added p50 at one client at or below Agent Lightning's,
at least 2.5x its calls per second at 16 and 64 clients, p99 at most 3x the
mean at 64, and at most 50 MB of growth over 50,000 calls.
"""

from __future__ import annotations

import asyncio
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from infra.processes import free_port, stop
from schemas.admin import ensure_topics
from schemas.rollout_token import mint
from schemas.settings import BusSettings

from _load import Result, cpu_seconds, load, rss_mb
from _shared import ADMIN, SECRET, arguments, pyplot, save, scratch_broker, start_engine, start_gateway

console = Console(width=max(160, shutil.get_terminal_size().columns))
ROOT = Path(__file__).parent.parent
PEER = "agentlightning>=1.0,<1.1"
PEER_HOME = ROOT / ".tether" / "peers" / "agentlightning-1.0"
LAUNCHER = Path(__file__).parent / "peers" / "agentlightning_gateway.py"
REPLY = "Sure, here is a short answer."
MESSAGES = [{"role": "system", "content": "You are a helpful agent."},
            {"role": "user", "content": "Summarise the file in one line."}]
GATEWAYS = ("agentlightning", "tether")


def peer_python(given: str | None) -> Path:
    """Agent Lightning's own environment, made on first use from PyPI."""
    python = PEER_HOME / "bin" / "python"
    if not python.exists():
        base = given or next((p for p in _candidates() if _version(p) >= (3, 12)), None)
        if base is None:
            raise SystemExit("Agent Lightning 1.0 needs Python 3.12 or newer, and none was found on PATH or under "
                             "pyenv: give one with --peer-python")
        console.print(f"making Agent Lightning's environment with {base}: {PEER_HOME}")
        subprocess.run([sys.executable, "-m", "uv", "venv", "--python", str(base), str(PEER_HOME)], check=True)
        subprocess.run([sys.executable, "-m", "uv", "pip", "install", "--python", str(python), PEER], check=True)
    return python


def _candidates() -> list[str]:
    found = [shutil.which(f"python3.{minor}") for minor in range(14, 11, -1)]
    pyenv = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[2-9]*/bin/python")), reverse=True)
    return [p for p in found if p] + pyenv


def _version(python: str) -> tuple[int, int]:
    try:
        out = subprocess.run([python, "-c", "import sys; print(sys.version_info[0], sys.version_info[1])"],
                             capture_output=True, text=True, timeout=30)
        major, minor = out.stdout.split()
        return int(major), int(minor)
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return (0, 0)


def start_peer(python: Path, upstream: str, scratch: Path) -> tuple[str, subprocess.Popen[bytes], str]:
    port = free_port()
    process = subprocess.Popen([str(python), str(LAUNCHER), "--port", str(port), "--upstream", f"{upstream}/v1"],
                               stdout=(scratch / "agentlightning.log").open("wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    log = scratch / "agentlightning.log"
    deadline = time.monotonic() + 180
    while b"ready" not in log.read_bytes():  # it answers, its model and rollouts are registered
        if process.poll() is not None or time.monotonic() > deadline:
            stop(process)
            raise SystemExit(f"Agent Lightning's gateway did not start: {log.read_text()[-2000:]}")
        time.sleep(0.2)
    version = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.version('agentlightning'))"],
                             capture_output=True, text=True, check=True).stdout.strip()
    return url, process, version


def main() -> None:
    parser = arguments(__doc__, "peer_gateway.png")
    parser.add_argument("--requests", type=int, default=5000, help="calls per level and gateway (a quarter at 1)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--memory-calls", type=int, default=50_000)
    parser.add_argument("--warmup", type=int, default=500, help="untimed calls through each gateway first")
    parser.add_argument("--peer-python", help="a Python 3.12+ to make Agent Lightning's environment with")
    args = parser.parse_args()
    python = peer_python(args.peer_python)
    scratch, broker = scratch_broker("tether-peer-bench-")
    processes: list[subprocess.Popen[bytes]] = []
    rows: dict[tuple[int, str], list[tuple[Result, float]]] = {}
    acks: dict[int, list[float]] = {}  # Tether's mean wait for Kafka's acknowledgement per call, by level
    memory: dict[str, list[tuple[int, float]]] = {}
    try:
        with console.status("starting Kafka, FakeVLLM and both gateways..."):
            from tether.tiny_model import init_tiny

            model = init_tiny(scratch / "tiny")
            broker.start()
            bus = BusSettings(bootstrap_servers=broker.bootstrap)
            asyncio.run(ensure_topics(bus))
            engine, process = start_engine("fake", model, (REPLY,), scratch)
            processes.append(process)
            peer, process, version = start_peer(python, engine, scratch)
            processes.append(process)
            tether, process = start_gateway(engine, model, bus, "bench", scratch)
            processes.append(process)
        pids = {"agentlightning": processes[1].pid, "tether": processes[2].pid}
        tokens = [mint(r, SECRET) for r in register(tether, 64)]
        urls: dict[str, str | list[str]] = {
            "direct": f"{engine}/v1/chat/completions", "tether": f"{tether}/v1/chat/completions",
            # the rollout is in Agent Lightning's path: calls go round its rollouts as Tether's go round its tokens
            "agentlightning": [f"{peer}/proxy/rollout/bench-{i}/attempt/0/mode/train/openai/v1/chat/completions"
                               for i in range(64)]}
        body = {"model": "m", "messages": MESSAGES, "max_tokens": 64}

        def through(name: str, n: int, level: int) -> Result:
            headers = ([{"authorization": f"Bearer {tokens[i % 64]}"} for i in range(n)] if name == "tether"
                       else [{}] * n)
            return asyncio.run(load(urls[name], [body] * n, headers, level, False))

        for name in ("direct", *GATEWAYS):
            through(name, args.warmup, 8)
        with Progress(console=console) as bar:
            task = bar.add_task("levels × repetitions", total=len(args.levels) * args.repeats)
            for _ in range(args.repeats):
                for level in args.levels:
                    n = args.requests if level > 1 else max(10, args.requests // 4)
                    for name in ("direct", *GATEWAYS):
                        cpu = cpu_seconds(pids[name]) if name in pids else 0.0
                        waited = publish_wait(tether) if name == "tether" else (0.0, 0)
                        result = through(name, n, level)
                        cpu_ms = (cpu_seconds(pids[name]) - cpu) / n * 1000 if name in pids else 0.0
                        rows.setdefault((level, name), []).append((result, cpu_ms))
                        if name == "tether":
                            (s1, c1), (s0, c0) = publish_wait(tether), waited
                            acks.setdefault(level, []).append((s1 - s0) / max(1, c1 - c0) * 1000)
                    bar.advance(task)
            for name in GATEWAYS:
                task = bar.add_task(f"memory: {name}", total=args.memory_calls)
                done, memory[name] = 0, []
                for target in (args.memory_calls // 10, args.memory_calls):
                    while done < target:
                        chunk = min(2000, target - done)
                        through(name, chunk, 64)
                        done += chunk
                        bar.advance(task, chunk)
                    memory[name].append((done, rss_mb(pids[name])))
    finally:
        for p in reversed(processes):
            stop(p)
        broker.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    report(rows, acks, memory, args, version)


def publish_wait(gateway: str) -> tuple[float, int]:
    """Seconds the gateway has waited for Kafka's acknowledgements so far, and how many (its /metrics): the part
    of each call's added time that is the write to the log before the answer, which Agent Lightning does not
    wait for."""
    total, count = 0.0, 0
    for line in httpx.get(f"{gateway}/metrics", timeout=10).text.splitlines():
        if line.startswith("tether_gateway_kafka_publish_seconds_sum"):
            total = float(line.split()[-1])
        elif line.startswith("tether_gateway_kafka_publish_seconds_count"):
            count = int(float(line.split()[-1]))
    return total, count


def register(gateway: str, n: int) -> list[str]:
    ids = [f"bench-{i}" for i in range(n)]
    with httpx.Client(base_url=gateway, headers={"authorization": f"Bearer {ADMIN}"}) as http:
        for rollout_id in ids:
            http.post("/admin/rollouts", json={"rollout_id": rollout_id}).raise_for_status()
    return ids


def _median(values: list[float]) -> float:
    return statistics.median(values)


def report(rows: dict[tuple[int, str], list[tuple[Result, float]]], acks: dict[int, list[float]],
           memory: dict[str, list[tuple[int, float]]], args: Any, version: str) -> None:
    table = Table(title=f"Tether's gateway beside Agent Lightning {version}'s (FakeVLLM answers at once; median "
                        f"of {args.repeats} repetitions)")
    for column in ("clients", "gateway", "added p50 ms", "p99 ms", "mean ms", "p99/mean", "calls/s",
                   "calls/s vs AL", "CPU ms/call", "Kafka ack ms"):
        table.add_column(column, justify="right")
    figures: dict[str, Any] = {"agentlightning": version, "levels": {}}
    for level in args.levels:
        direct = _median([r.p50 for r, _ in rows[(level, "direct")]])
        peer_rate = _median([r.rate for r, _ in rows[(level, "agentlightning")]])
        for name in GATEWAYS:
            got = rows[(level, name)]
            f = {"added_p50_ms": _median([r.p50 for r, _ in got]) - direct, "p99_ms": _median([r.p99 for r, _ in got]),
                 "mean_ms": _median([r.mean for r, _ in got]), "rate": _median([r.rate for r, _ in got]),
                 "cpu_ms": _median([c for _, c in got])}
            if name == "tether":
                f["kafka_ack_ms"] = _median(acks[level])
            figures["levels"].setdefault(str(level), {})[name] = f
            table.add_row(str(level), name, f"{f['added_p50_ms']:+.2f}", f"{f['p99_ms']:.2f}", f"{f['mean_ms']:.2f}",
                          f"{f['p99_ms'] / f['mean_ms']:.1f}", f"{f['rate']:,.0f}", f"{f['rate'] / peer_rate:.2f}x",
                          f"{f['cpu_ms']:.2f}", f"{f['kafka_ack_ms']:.2f}" if "kafka_ack_ms" in f else "-")
    console.print(table)
    for name, points in memory.items():
        (a, rss_a), (b, rss_b) = points
        console.print(f"{name}: RSS {rss_a:.0f} MB after {a:,} calls, {rss_b:.0f} MB after {b:,} "
                      f"({rss_b - rss_a:+.0f} MB)")
    figures["rss_mb"] = memory
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(figures, indent=1))
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for name in GATEWAYS:
        levels = [str(level) for level in args.levels]
        left.plot(levels, [figures["levels"][lv][name]["added_p50_ms"] for lv in levels], "o-", label=name)
        right.plot(levels, [figures["levels"][lv][name]["rate"] for lv in levels], "o-", label=name)
    left.set(xlabel="concurrent clients", ylabel="added p50 (ms)", title="latency added over the engine")
    right.set(xlabel="concurrent clients", ylabel="calls/s", title="calls per second")
    left.legend()
    save(fig, args.out, console)


if __name__ == "__main__":
    main()
