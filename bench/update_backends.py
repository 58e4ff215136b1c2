"""Update time per step for both backends on the same batch: the embedded torch learner, and verl's workers at
world size 1 and 2.

    .venv/bin/python bench/update_backends.py [--groups 8] [--group-size 4] [--steps 4]

The batch is the one bench/trainer_step.py uses (synthetic task groups whose
rollouts make 1-4 calls with prompts of 100-1,500 tokens). Each backend takes
--steps updates on it from the tiny model (the first, which warms up, is
reported apart); verl's are FSDP2 workers on Ray, on this machine CPU
processes over gloo. Also the set-up time: Ray and verl's `init_model`.
Prints the median step time and tokens/s; writes bench/results/update_backends.png.
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import ray
import torch
from rich.console import Console
from rich.table import Table
from transformers import AutoModelForCausalLM

from _shared import arguments, pyplot, save

sys.path.insert(0, str(Path(__file__).parent.parent))  # the synthetic run generator lives with the tests
from schemas.events import TaskGroup
from stream_processors.grouping import Policy
from stream_processors.pipeline import rebuild
from tests.factories import synthetic_run
from tether.tiny_model import init_tiny
from trainer.advantages import ScoredGroups
from trainer.backend import UpdateBackend
from trainer.config import TrainerConfig
from trainer.learner import TorchLearner
from trainer.verl.backend import VerlBackend
from trainer.verl.workers import VerlWorkers

console = Console(width=max(120, shutil.get_terminal_size().columns))


def batch(model_dir: Path, groups: int, group_size: int) -> list[TaskGroup]:
    vocab = AutoModelForCausalLM.from_pretrained(model_dir).config.vocab_size
    out: list[TaskGroup] = []
    for g in range(groups):
        events = synthetic_run(f"bench{g}", 1, group_size, calls=(1, 4), seed=g, vocab=vocab,
                               prompt_tokens=100 + (g * 397) % 1400, response_tokens=80)
        out += rebuild(events, f"bench{g}", Policy())
    return out


def timed(backend: UpdateBackend, groups: list[TaskGroup], steps: int) -> tuple[list[float], int]:
    seconds, tokens = [], 0
    for step in range(steps):
        started = time.perf_counter()
        metrics = backend.update(ScoredGroups.of(groups), version=step)
        seconds.append(time.perf_counter() - started)
        tokens = metrics.tokens
        console.print(f"  step {step}: {seconds[-1]:.2f} s, loss {metrics.loss:.4f}")
    return seconds, tokens


def main() -> None:
    parser = arguments(__doc__, "update_backends.png")
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=4, help="updates per backend (at least 2)")
    args = parser.parse_args()
    if args.steps < 2:
        parser.error("--steps must be at least 2 (the first warms up)")
    torch.manual_seed(0)
    scratch = Path(tempfile.mkdtemp(prefix="tether-backends-bench-"))
    results: dict[str, dict[str, float]] = {}
    try:
        model_dir = init_tiny(scratch / "tiny")
        groups = batch(model_dir, args.groups, args.group_size)
        config = TrainerConfig(run_id="bench", model=model_dir, checkpoint_dir=scratch / "ckpt", lr=1e-4,
                               device="cpu")
        console.print("torch learner")
        started = time.perf_counter()
        learner = TorchLearner.load(config, torch.device("cpu"), None)
        setup = time.perf_counter() - started
        seconds, tokens = timed(learner, groups, args.steps)
        results["torch (1 process)"] = summary(seconds, tokens, setup)
        for world in (1, 2):
            console.print(f"verl, {world} worker(s)")
            started = time.perf_counter()
            workers = VerlWorkers.start(config, world)
            setup = time.perf_counter() - started
            try:
                seconds, tokens = timed(VerlBackend(config, workers), groups, args.steps)
            finally:
                workers.close()
            results[f"verl ({world} worker{'s' if world > 1 else ''})"] = summary(seconds, tokens, setup)
    finally:
        if ray.is_initialized():
            ray.shutdown()
        shutil.rmtree(scratch, ignore_errors=True)

    table = Table(title=f"One update: {args.groups} task groups x K={args.group_size}, tiny model, CPU")
    for column in ("backend", "set-up s", "first step s", "step s (median)", "tokens", "tokens/s"):
        table.add_column(column, justify="right")
    for name, r in results.items():
        table.add_row(name, f"{r['setup']:.1f}", f"{r['first']:.2f}", f"{r['median']:.2f}", f"{r['tokens']:,.0f}",
                      f"{r['tokens'] / r['median']:,.0f}")
    console.print(table)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.5))
    names = list(results)
    ax.bar(names, [results[n]["median"] for n in names], color=["tab:blue", "tab:orange", "tab:red"][:len(names)])
    ax.set_ylabel("seconds per update (median)")
    ax.set_title("Update time per step by backend")
    save(fig, args.out, console)


def summary(seconds: list[float], tokens: int, setup: float) -> dict[str, float]:
    return {"setup": setup, "first": seconds[0], "median": statistics.median(seconds[1:]), "tokens": float(tokens)}


if __name__ == "__main__":
    main()
