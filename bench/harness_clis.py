"""Claude Code and Codex through the gateway: calls per rollout, prompt tokens per call, and what the gateway adds.

    .venv/bin/python bench/harness_clis.py [--rollouts 4] [--engine fake|tiny] [--context 32768]

Needs the CLIs (`make harnesses`). Each CLI runs --rollouts times, one after
another, on "create hello.txt containing hi", unmodified, pointed at a gateway
that records to Kafka. The engine is FakeVLLM scripted as a model would act
(the CLI's shell tool, then a final message), or with `--engine tiny` the
embedded engine on the tiny random model built with --context (it writes
nonsense: the point is that such prompts go through and are recorded).

From the recorded calls it prints, per CLI: calls per rollout, prompt tokens
per call, how many calls extended the previous prompt token for token, the
engine's time per call, and the gateway's own time per call: from receiving
the request to its event being built (rendering the ~25k-token prompt, the
engine hop excluded, the Kafka acknowledgement not yet), and its mean time
per call end to end minus the engine's (from its /metrics). And the wall time
of a rollout (the CLI's start-up included). Then the same rollouts again
through a gateway that also renders every call from its first message and
tokenises it whole (TETHER_GATEWAY_RENDER_CHECK_EVERY=1): the share of calls
rendered from the rollout's previous call, and how many prompts differed from
the whole rendering (0 is the contract). Writes bench/results/harness_clis.json
and a plot of prompt sizes and the gateway's time per CLI.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

from infra.processes import stop
from schemas.admin import ensure_topics
from schemas.calls import whole
from schemas.events import ModelCall
from schemas.rollout_token import mint
from schemas.settings import BusSettings
from stream_processors.replay import read_run_events

from _shared import ADMIN, SECRET, arguments, pyplot, save, scratch_broker, start_engine, start_gateway

sys.path.insert(0, str(Path(__file__).parent.parent))  # the scripted engine lives with the tests
from tests.fakes.vllm import tool_call

console = Console(width=max(140, shutil.get_terminal_size().columns))
NPM_BIN = Path(__file__).parent.parent / "examples" / "npm" / "node_modules" / ".bin"
TASK = "Create a file hello.txt containing the word hi."
CODEX_CONFIG = (Path(__file__).parent.parent / "examples" / "codex" / "config.toml").read_text()


@dataclass(frozen=True)
class Cli:
    name: str
    replies: tuple[str, ...]

    def argv(self) -> list[str]:
        if self.name == "claude-code":
            return [str(NPM_BIN / "claude"), "-p", TASK, "--output-format", "json", "--allowedTools",
                    "Bash,Write,Edit,Read", "--disallowedTools", "WebFetch,WebSearch"]
        return [str(NPM_BIN / "codex"), "exec", "--skip-git-repo-check", TASK]

    def env(self, gateway: str, token: str, workdir: Path) -> dict[str, str]:
        if self.name == "claude-code":
            (workdir / "home").mkdir()
            return {"ANTHROPIC_BASE_URL": gateway, "ANTHROPIC_API_KEY": token, "HOME": str(workdir / "home"),
                    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1",
                    "DISABLE_AUTOUPDATER": "1", "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "256"}
        home = workdir / ".codex"
        home.mkdir()
        (home / "config.toml").write_text(CODEX_CONFIG.replace("@BASE_URL@", f"{gateway}/v1"))
        return {"OPENAI_API_KEY": token, "CODEX_HOME": str(home)}


CLIS = (Cli("claude-code", (tool_call("Bash", {"command": "printf hi > hello.txt", "description": "Write it"}),
                            "Done.")),
        Cli("codex", (tool_call("exec_command", {"cmd": "printf hi > hello.txt"}), "Done.")))


def server_seconds(gateway: str) -> tuple[float, float]:
    """Sum and count of the gateway's own call-time histogram, over every API."""
    total = count = 0.0
    for line in httpx.get(f"{gateway}/metrics").text.splitlines():
        if line.startswith("tether_gateway_call_seconds_sum"):
            total += float(line.split()[-1])
        elif line.startswith("tether_gateway_call_seconds_count"):
            count += float(line.split()[-1])
    return total, count


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def main() -> None:
    parser = arguments(__doc__, "harness_clis.png")
    parser.add_argument("--rollouts", type=int, default=4, help="rollouts per CLI (at least 1)")
    parser.add_argument("--engine", choices=("fake", "tiny"), default="fake")
    parser.add_argument("--context", type=int, default=32768, help="the tiny model's context")
    args = parser.parse_args()
    if args.rollouts < 1:
        parser.error("--rollouts must be at least 1")
    if not (NPM_BIN / "claude").exists() or not (NPM_BIN / "codex").exists():
        raise SystemExit(f"the CLIs are not in {NPM_BIN}: run `make harnesses`")

    scratch, broker = scratch_broker("tether-clis-bench-")
    summary: dict[str, dict[str, float]] = {}
    try:
        with console.status("starting Kafka and building the tiny model..."):
            from tether.tiny_model import init_tiny

            model = init_tiny(scratch / "tiny", context=args.context)
            broker.start()
            bus = BusSettings(bootstrap_servers=broker.bootstrap)
            asyncio.run(ensure_topics(bus))
        for cli in CLIS:
            summary[cli.name] = rollouts(cli, args, model, bus, scratch, checked=False)
            # again, every call's prompt also rendered from its first message and tokenised whole (which costs
            # what the first pass measured the gateway without): the prompts it served were those ids
            checked = rollouts(cli, args, model, bus, scratch, checked=True)
            summary[cli.name].update({k: v for k, v in checked.items() if k.startswith("render")})
    finally:
        broker.stop()
        shutil.rmtree(scratch, ignore_errors=True)

    table = Table(title=f"Claude Code and Codex through the gateway ({args.engine} engine; Kafka acks=all)")
    for column in ("", *next(iter(summary.values()))):
        table.add_column(column, justify="right")
    for name, row in summary.items():
        table.add_row(name, *[f"{v:,.1f}" for v in row.values()])
    console.print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps({"engine": args.engine, "clis": summary}, indent=1))
    console.print(f"figures: {args.out.with_suffix('.json')}")
    plot(summary, args.engine, args.out)


def rollouts(cli: Cli, args: argparse.Namespace, model: Path, bus: BusSettings, scratch: Path,
             checked: bool) -> dict[str, float]:
    """--rollouts of the CLI through a gateway of its own; `checked`: that gateway renders every call both ways."""
    run_id = f"bench-{cli.name}" + ("-checked" if checked else "")
    engine, engine_process = start_engine(args.engine, model, cli.replies, scratch)
    gateway, gateway_process = start_gateway(engine, model, bus, run_id, scratch,
                                             {"TETHER_GATEWAY_RENDER_CHECK_EVERY": "1" if checked else "0"})
    walls: list[float] = []
    try:
        before = server_seconds(gateway)
        for i in range(args.rollouts):
            rollout_id = f"{run_id}-{i}"
            httpx.post(f"{gateway}/admin/rollouts", json={"rollout_id": rollout_id},
                       headers={"authorization": f"Bearer {ADMIN}"}).raise_for_status()
            workdir = scratch / rollout_id
            workdir.mkdir()
            env = {**os.environ, **cli.env(gateway, mint(rollout_id, SECRET), workdir)}
            started = time.perf_counter()
            done = subprocess.run(cli.argv(), cwd=workdir, env=env, capture_output=True, timeout=900)
            walls.append(time.perf_counter() - started)
            ok = (workdir / "hello.txt").exists()
            console.print(f"{cli.name} rollout {i}{' (checked)' if checked else ''}: exit {done.returncode}, "
                          f"{walls[-1]:.1f} s" + (", wrote hello.txt" if ok else ""))
        after = server_seconds(gateway)
        rendering = counters(gateway, ("tether_gateway_resumed_renders_total",
                                       "tether_gateway_render_mismatches_total"))
    finally:
        stop(gateway_process)
        stop(engine_process)
    # whole again: a call that extends another is recorded as what it adds (schemas/calls.py)
    calls = whole(e for e in asyncio.run(read_run_events(bus, run_id)) if isinstance(e, ModelCall))
    figures = measure(calls, args.rollouts, walls, after, before)
    figures["rendering resumed %"] = 100.0 * rendering[0] / len(calls) if calls else float("nan")
    figures["render mismatches"] = rendering[1]
    return figures


def counters(gateway: str, names: tuple[str, ...]) -> list[float]:
    found = dict.fromkeys(names, 0.0)
    for line in httpx.get(f"{gateway}/metrics").text.splitlines():
        name, _, value = line.partition(" ")
        if name in found:
            found[name] = float(value)
    return list(found.values())


def plot(summary: dict[str, dict[str, float]], engine: str, out: Path) -> None:
    plt = pyplot()
    names = list(summary)
    fig, (tokens, gateway) = plt.subplots(1, 2, figsize=(10, 3.5))
    tokens.bar(names, [summary[n]["prompt tokens p50"] for n in names], color="tab:blue")
    tokens.set_ylabel("prompt tokens per call (p50)")
    tokens.set_title("what each CLI sends")
    keys = ("gateway ms before record p50", "gateway ms before record p99", "gateway ms/call minus engine")
    width = 0.8 / len(keys)
    for i, key in enumerate(keys):
        gateway.bar([x + i * width for x in range(len(names))], [summary[n][key] for n in names], width,
                    label=key.removeprefix("gateway "))
    gateway.set_xticks([x + width for x in range(len(names))], names)
    gateway.set_ylabel("ms")
    gateway.set_title(f"the gateway's own time ({engine} engine)")
    gateway.legend(fontsize=8)
    save(fig, out, console)


def measure(calls: list[ModelCall], rollouts: int, walls: list[float], after: tuple[float, float],
            before: tuple[float, float]) -> dict[str, float]:
    ok = [c for c in calls if c.status == "ok"]
    by_rollout: dict[str, list[ModelCall]] = {}
    for c in sorted(ok, key=lambda c: c.seq):
        by_rollout.setdefault(c.rollout_id, []).append(c)
    extended = pairs = 0
    for chain in by_rollout.values():
        for a, b in itertools.pairwise(chain):
            pairs += 1
            head = a.prompt_token_ids + a.response_token_ids
            extended += b.prompt_token_ids[:len(head)] == head
    prompts = [float(len(c.prompt_token_ids)) for c in ok]
    engine_ms = [c.timings.engine_ms for c in ok]
    own_ms = [(c.timings.finished_at - c.timings.received_at).total_seconds() * 1000 - c.timings.engine_ms
              - c.timings.queued_ms for c in ok]
    seconds, count = after[0] - before[0], after[1] - before[1]
    return {
        "calls/rollout": len(calls) / rollouts, "errors": float(len(calls) - len(ok)),
        "prompt tokens p50": statistics.median(prompts) if prompts else 0.0, "prompt tokens max": max(prompts or [0]),
        "extended %": 100.0 * extended / pairs if pairs else float("nan"),
        "engine ms p50": statistics.median(engine_ms) if engine_ms else 0.0,
        "gateway ms before record p50": statistics.median(own_ms) if own_ms else 0.0,
        "gateway ms before record p99": pct(own_ms, 0.99),
        "gateway ms/call minus engine": (seconds / count * 1000 - statistics.fmean(engine_ms)) if count else 0.0,
        "rollout wall s p50": statistics.median(walls),
    }


if __name__ == "__main__":
    main()
