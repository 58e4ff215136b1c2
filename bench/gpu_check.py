"""The GPU paths in one go, for a session lent a GPU; on a machine without one it runs the same steps on the CPU.

    .venv/bin/python bench/gpu_check.py [--model DIR] [--updates 3] [--prompt-tokens 1000]

1. The embedded engine as its own process (`tether engine serve`, bfloat16 on a GPU, float32 on a CPU): 8
   requests sharing a long prefix, twice; tokens/s of each round and what the prefix cache reused.
2. The trainer's update (the torch learner, in this process, on the same device): seconds per update on
   synthetic task groups, and peak accelerator memory.
3. The hand-over between the two processes (`trainer/engines/`): the staged checkpoint onto the engine by the
   disk path, timed, its version checked; collocated, the engine slept before and woken after; and the
   distributed path's seam (the trainer's torch weight group, gloo, to the SGLang fake) with the tensors checked.
   Two processes on one GPU cannot form an NCCL group (NCCL refuses two ranks on one device), so NCCL itself
   needs two GPUs or a real vLLM/SGLang replica.

Prints one table; exits non-zero if a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).parent.parent))  # the synthetic runs and the fakes live with the tests
from infra.processes import free_port, stop, wait_healthy
from stream_processors.grouping import Policy
from stream_processors.pipeline import rebuild
from tests.factories import synthetic_run
from tests.fakes.held_weights import fingerprint, read_folder
from tether.tiny_model import init_tiny
from trainer.advantages import ScoredGroups
from trainer.checkpoint import TrainerState
from trainer.config import EngineConfig, TrainerConfig
from trainer.engines.fleet import EngineFleet
from trainer.learner import TorchLearner

console = Console(width=max(120, shutil.get_terminal_size().columns))


def serve(args: list[str], log: Path, env: dict[str, str]) -> tuple[str, subprocess.Popen[bytes]]:
    port = free_port()
    with log.open("wb") as out:
        process = subprocess.Popen([sys.executable, "-m", *args, "--port", str(port)], stdout=out,
                                   stderr=subprocess.STDOUT, env={**os.environ, **env})
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, process, args[0], log=log, timeout_s=300)
    return url, process


async def engine_rounds(url: str, model: str, prompt_tokens: int) -> list[tuple[float, int, int]]:
    """Two rounds of 8 requests sharing a prefix: (tokens/s, prefix-cache hits, reused tokens) of each."""
    prefix = [(7 * i) % 900 + 10 for i in range(prompt_tokens)]
    rounds = []
    async with httpx.AsyncClient(base_url=url, timeout=600) as http:
        for r in range(2):
            before = (await http.get("/health")).json()["prefix_cache"]
            started = time.perf_counter()
            replies = await asyncio.gather(*(http.post("/v1/completions", json={
                "model": model, "prompt": [*prefix, 11 + i + 8 * r], "max_tokens": 32, "ignore_eos": True,
                "temperature": 1.0}) for i in range(8)))
            seconds = time.perf_counter() - started
            tokens = sum(reply.json()["usage"]["completion_tokens"] for reply in replies)
            after = (await http.get("/health")).json()["prefix_cache"]
            rounds.append((tokens / seconds, after["hits"] - before["hits"],
                           after["reused_tokens"] - before["reused_tokens"]))
    return rounds


def groups(run_id: str, n: int) -> list:  # type: ignore[type-arg]
    return rebuild(synthetic_run(run_id, groups=n, group_size=4, seed=0, calls=(1, 3), prompt_tokens=200,
                                 response_tokens=32, vocab=1000), run_id, Policy())


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=None, help="default: the tiny model, built here")
    parser.add_argument("--updates", type=int, default=3)
    parser.add_argument("--prompt-tokens", type=int, default=1000)
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    dtype = "bfloat16" if cuda else "float32"
    work = Path(tempfile.mkdtemp(prefix="tether-gpu-check-"))
    model = args.model or init_tiny(work / "tiny", seed=0)
    rows: list[tuple[str, str, str]] = []
    failures: list[str] = []
    console.print(f"device: {torch.cuda.get_device_name() if cuda else 'cpu'}; torch {torch.__version__}; "
                  f"engine dtype {dtype}")

    engine_url, engine = serve(["tether.cli", "engine", "serve", "--model", str(model)], work / "engine.log",
                               {"TETHER_ENGINE_DTYPE": dtype})
    sglang_url, sglang = serve(["tests.fakes.sglang", "--model", str(model)], work / "sglang.log", {})
    try:
        console.print("1/3 the engine: two rounds of 8 requests sharing a prefix")
        (cold, _, _), (warm, hits, reused) = await engine_rounds(engine_url, str(model), args.prompt_tokens)
        rows += [("engine tokens/s, first round", f"{cold:,.0f}", dtype),
                 ("engine tokens/s, prefix cached", f"{warm:,.0f}", f"{warm / cold:.2f}x the first round"),
                 ("prefix cache, second round", f"{hits} hits", f"{reused:,} tokens reused")]
        if hits < 8:
            failures.append(f"the prefix cache served {hits} of the 8 requests sharing a cached prefix")

        console.print(f"2/3 the trainer: {args.updates} updates on {device}")
        config = TrainerConfig(run_id="gpu-check", model=model, checkpoint_dir=work / "ckpt", device=device.type,
                               batch_groups=4, zero_variance="keep")
        learner = TorchLearner.load(config, device, None)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        seconds = []
        for version in range(args.updates):
            scored = ScoredGroups.of(groups(f"gpu-check-{version}", 4), config.advantage)
            started = time.perf_counter()
            learner.update(scored, version)
            if cuda:
                torch.cuda.synchronize()
            seconds.append(time.perf_counter() - started)
        median = sorted(seconds)[len(seconds) // 2]
        rows.append(("update, seconds (first, then median)", f"{seconds[0]:.2f} / {median:.2f}",
                     "4 task groups of 4 rollouts"))
        if cuda:
            rows.append(("update, peak accelerator memory", f"{torch.cuda.max_memory_allocated() / 2**20:,.0f} MiB",
                         ""))

        console.print("3/3 the hand-over between processes")
        state = TrainerState(version=args.updates)
        staged = learner.stage(config.run_dir, state)
        disk = EngineFleet(EngineConfig(kind="tether", urls=[engine_url], collocated=True))
        started = time.perf_counter()
        await disk.before_update((model, 0))
        slept = time.perf_counter() - started
        started = time.perf_counter()
        await disk.deliver(staged, args.updates, (model, 0))
        delivered = time.perf_counter() - started
        held = await disk.replicas[0].held()
        await disk.aclose()
        rows += [("collocated: engine asleep", f"{slept:.2f} s", "paused, caches dropped, weights to host"),
                 ("disk hand-over: wake, load, reset, resume", f"{delivered:.2f} s", f"engine holds version {held}")]
        if held != args.updates:
            failures.append(f"the engine holds version {held} after the hand-over of {args.updates}")

        group = EngineFleet(EngineConfig(kind="sglang", urls=[sglang_url], transfer="distributed",
                                         group_backend="gloo", group_timeout_s=60))
        started = time.perf_counter()
        await group.deliver(staged, args.updates, (model, 0))
        broadcast = time.perf_counter() - started
        await group.aclose()
        async with httpx.AsyncClient() as http:
            state_ = (await http.get(f"{sglang_url}/fake/state")).json()
        nbytes = sum(t.numel() * t.element_size() for t in read_folder(staged).values())
        same = state_["fingerprint"] == fingerprint(read_folder(staged).items())
        rows.append(("weight group (gloo) to the SGLang fake", f"{broadcast:.2f} s",
                     f"{nbytes / 2**20:,.1f} MiB, tensors {'identical' if same else 'DIFFERENT'}"))
        if not same:
            failures.append("the SGLang fake's tensors differ from the staged checkpoint's")
    finally:
        stop(engine)
        stop(sglang)

    table = Table(title="GPU check" if cuda else "GPU check (on the CPU: no GPU here)")
    for column in ("what", "figure", "note"):
        table.add_column(column)
    for row in rows:
        table.add_row(*row)
    console.print(table)
    for failure in failures:
        console.print(f"[red]FAILED[/red] {failure}")
    shutil.rmtree(work, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
