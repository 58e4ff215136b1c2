"""The gateway's own time per call as a rollout's context grows: rendering resumed from the rollout's previous
call, and tokenising only the pieces not seen before, beside every call rendered and tokenised whole.

    .venv/bin/python bench/context_cost.py [--contexts 1000 28000 64000 128000] [--calls 20]

For each context a rollout opens with a conversation of about that many
tokens (a harness's system prompt and tool list, then earlier turns: a tool
call and its result each) and makes --calls calls after it, each the previous
conversation plus the model's answer and a tool result of about 200 tokens,
as an agent loop sends them. FakeVLLM answers at once. The same calls go to
two gateways on one broker, one after the other: the whole path
(TETHER_GATEWAY_RESUME_RENDERING=false, TETHER_GATEWAY_TOKEN_CACHE_TOKENS=0,
every call as before this change) and the default. The gateway's own time of
a call is taken from its record: received to recorded, less the engine's
time (the hop to FakeVLLM, which grows with the prompt it is sent, is the
engine's). The prompts both gateways recorded are compared call by call.
Prints, per context, the own time p50 of both paths, their ratio, each
path's p50 against its own at the smallest context (the target: within 1.5x),
and the engine hop (the prompt sent, the answer read back);
writes bench/results/context_cost.png.
"""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from gateway.tokenizer import ChatTokenizer
from infra.processes import stop
from schemas.admin import ensure_topics
from schemas.calls import whole
from schemas.events import ModelCall
from schemas.rollout_token import mint
from schemas.settings import BusSettings
from stream_processors.replay import read_run_events

from _load import rss_mb
from _shared import ADMIN, SECRET, arguments, pyplot, save, scratch_broker, start_engine, start_gateway

console = Console(width=max(140, shutil.get_terminal_size().columns))
PATHS = {"whole": {"TETHER_GATEWAY_RESUME_RENDERING": "false", "TETHER_GATEWAY_TOKEN_CACHE_TOKENS": "0"},
         "resumed": {}}
REPLY = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la src/"}}\n</tool_call>'
WORDS = ("def", "return", "self", "import", "class", "value", "error", "path", "config", "test", "module", "file",
         "print", "result", "items", "index", "count", "=", "(", ")", ":", "\n", "    ", "#", "0", "1", "'x'")


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def conversation(seed: int, tokens: int, count: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Messages and tools of about `tokens` tokens as `count(messages, tools)` counts them."""
    messages, tools = _conversation(random.Random(seed), tokens)
    return _conversation(random.Random(seed), int(tokens * tokens / count(messages, tools)))


def _conversation(rng: random.Random, words: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    tools = [{"type": "function", "function": {"name": f"tool_{i}", "description": text(rng, min(150, words // 60)),
                                               "parameters": {"type": "object", "properties": {
                                                   "command": {"type": "string"}}}}} for i in range(12)]
    system = min(words // 2, 12_000)
    messages: list[dict[str, Any]] = [{"role": "system", "content": text(rng, system)},
                                      {"role": "user", "content": "Fix the failing test in src/."}]
    left = words - system - 12 * min(150, words // 60)
    turn = 0
    while left > 0:
        result = min(600, max(left, 20))
        messages += [{"role": "assistant", "content": "", "tool_calls": [{
                          "id": f"early-{turn}", "type": "function",
                          "function": {"name": "bash", "arguments": json.dumps({"command": f"cat f{turn}.py"})}}]},
                     {"role": "tool", "tool_call_id": f"early-{turn}", "content": text(rng, result)}]
        left -= result + 12
        turn += 1
    return messages, tools


def episode(gateway: str, token: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]], calls: int,
            rng: random.Random) -> None:
    """The opening call, then `calls` more, each answered and followed by a tool result (the agent loop)."""
    messages = list(messages)
    with httpx.Client(base_url=gateway, headers={"authorization": f"Bearer {token}"}, timeout=120) as http:
        for n in range(calls + 1):
            r = http.post("/v1/chat/completions", json={"model": "m", "messages": messages, "tools": tools,
                                                        "max_tokens": 64})
            r.raise_for_status()
            answer = r.json()["choices"][0]["message"]
            messages.append({k: v for k, v in answer.items() if k in ("role", "content", "tool_calls")})
            call_id = (answer.get("tool_calls") or [{"id": "none"}])[0]["id"]
            messages.append({"role": "tool", "tool_call_id": call_id, "content": text(rng, 50 + n % 7)})


def own_ms(call: ModelCall) -> float:
    t = call.timings
    return (t.finished_at - t.received_at).total_seconds() * 1000 - t.engine_ms


def main() -> None:
    parser = arguments(__doc__, "context_cost.png")
    parser.add_argument("--contexts", type=int, nargs="+", default=[1000, 28_000, 64_000, 128_000])
    parser.add_argument("--calls", type=int, default=20, help="timed calls per context, after the opening one")
    args = parser.parse_args()
    scratch, broker = scratch_broker("tether-context-bench-")
    recorded: dict[str, dict[int, list[ModelCall]]] = {}
    rss: dict[str, dict[int, float]] = {p: {} for p in PATHS}  # the gateway's resident MB after each rollout
    try:
        with console.status("starting Kafka and building the tiny model..."):
            from tether.tiny_model import init_tiny

            model = init_tiny(scratch / "tiny", context=max(args.contexts) + 8 * 1024)
            broker.start()
            bus = BusSettings(bootstrap_servers=broker.bootstrap)
            asyncio.run(ensure_topics(bus))
        tokenizer = ChatTokenizer.load(model)

        def count(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> int:
            return len(tokenizer.encode(tokenizer.apply_chat_template(messages, tools, add_generation_prompt=True)))

        engine, engine_process = start_engine("fake", model, (REPLY,), scratch)
        try:
            with Progress(console=console) as bar:
                task = bar.add_task("episodes", total=len(PATHS) * len(args.contexts))
                for path, env in PATHS.items():
                    run_id = f"bench-{path}"
                    gateway, process = start_gateway(engine, model, bus, run_id, scratch, env)
                    try:
                        for context in args.contexts:
                            rollout_id = f"{run_id}-{context}"
                            httpx.post(f"{gateway}/admin/rollouts", json={"rollout_id": rollout_id},
                                       headers={"authorization": f"Bearer {ADMIN}"}).raise_for_status()
                            messages, tools = conversation(context, context, count)
                            started = time.perf_counter()
                            episode(gateway, mint(rollout_id, SECRET), messages, tools, args.calls,
                                    random.Random(context + 1))
                            rss[path][context] = rss_mb(process.pid)  # with the rollout open
                            httpx.post(f"{gateway}/admin/rollouts/{rollout_id}/seal",
                                       headers={"authorization": f"Bearer {ADMIN}"}).raise_for_status()
                            bar.console.print(f"{path}: context {context:,}, {args.calls + 1} calls in "
                                              f"{time.perf_counter() - started:.1f} s, gateway RSS "
                                              f"{rss[path][context]:.0f} MB")
                            bar.advance(task)
                    finally:
                        stop(process)
                    calls = whole(c for c in asyncio.run(read_run_events(bus, run_id)) if isinstance(c, ModelCall))
                    recorded[path] = {c: sorted((x for x in calls if x.rollout_id == f"{run_id}-{c}"),
                                                key=lambda x: x.seq) for c in args.contexts}
        finally:
            stop(engine_process)
    finally:
        broker.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    report(recorded, rss, args.contexts, args.out)


def report(recorded: dict[str, dict[int, list[ModelCall]]], rss: dict[str, dict[int, float]], contexts: list[int],
           out: Path) -> None:
    table = Table(title="The gateway's own time per call (received to recorded, engine excluded), after the "
                        "opening call of each rollout")
    for column in ("context", "prompt tokens p50", *(f"{p} p50 ms" for p in PATHS), "whole / resumed",
                   *(f"{p} vs smallest" for p in PATHS), "engine hop p50 ms", "prompts equal",
                   *(f"{p} RSS MB" for p in PATHS)):
        table.add_column(column, justify="right")
    figures: dict[str, dict[int, float]] = {p: {} for p in PATHS}
    for context in contexts:
        timed = {p: recorded[p][context][1:] for p in PATHS}
        for p in PATHS:
            figures[p][context] = statistics.median(own_ms(c) for c in timed[p])
        pairs = list(zip(recorded["whole"][context], recorded["resumed"][context], strict=True))
        equal = sum(a.prompt_token_ids == b.prompt_token_ids for a, b in pairs)
        tokens = statistics.median(len(c.prompt_token_ids) for c in timed["resumed"])
        table.add_row(f"{context:,}", f"{tokens:,.0f}", *(f"{figures[p][context]:.2f}" for p in PATHS),
                      f"{figures['whole'][context] / figures['resumed'][context]:.1f}x",
                      *(f"{figures[p][context] / figures[p][contexts[0]]:.2f}x" for p in PATHS),
                      f"{statistics.median(c.timings.engine_ms for c in timed['resumed']):.1f}",
                      f"{equal}/{len(pairs)}", *(f"{rss[p][context]:.0f}" for p in PATHS))
    console.print(table)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({p: {str(c): v for c, v in f.items()} for p, f in figures.items()},
                                                   indent=1))
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for p in PATHS:
        ax.plot(contexts, [figures[p][c] for c in contexts], "o-", label=p)
    ax.set(xlabel="context (tokens)", ylabel="gateway's own ms per call (p50)", xscale="log", yscale="log",
           title="Own time per call as the context grows")
    ax.legend()
    save(fig, out, console)


if __name__ == "__main__":
    main()
