"""Low-rank adapters against full weights, per update: the step, peak memory, the checkpoint and the hand-over.

    .venv/bin/python bench/lora.py [--models tiny large] [--updates 3] [--rank 16]

For each model (tiny: the tests' 4-layer model, 0.9M parameters, on a batch of
4 task groups of 200-token prompts; large: the same family at hidden 1024 and
24 layers, about 300M, random weights, on 2 groups of 64-token prompts) and
each mode (full weights; `lora:` rank --rank, alpha 2 x rank, all linear
layers) a process of its own builds the torch learner, takes one update to
warm up and --updates more on the same synthetic batch, stages a checkpoint,
and hands it to an embedded engine that loaded the base (`load_checkpoint`: whole
weights read and copied in, or the adapter read and switched in). It reports
the update's median time, the process's peak resident memory (learner, its
optimiser and the engine together, as a collocated trainer holds them), the
checkpoint's bytes and the time to write it, and the hand-over's time. Prints
the two modes side by side with their ratios; writes bench/results/lora.png.
"""

from __future__ import annotations

import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from _shared import arguments, pyplot, save

sys.path.insert(0, str(Path(__file__).parent.parent))

console = Console(width=max(150, shutil.get_terminal_size().columns))
MODELS = {"tiny": {"hidden": 128, "layers": 4}, "large": {"hidden": 1024, "layers": 24}}
BATCH = {"tiny": {"groups": 4, "prompt_tokens": 200, "response_tokens": 48},  # one update in seconds on one core
         "large": {"groups": 2, "prompt_tokens": 64, "response_tokens": 32}}
MODES = ("full", "lora")


def child(model: Path, name: str, mode: str, updates: int, rank: int, work: Path, threads: int) -> dict[str, Any]:
    """One model and mode, measured in this process."""
    import asyncio

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from engine.engine import Engine
    from stream_processors.grouping import Policy
    from stream_processors.pipeline import rebuild
    from tests.factories import synthetic_run
    from trainer import checkpoint
    from trainer.advantages import ScoredGroups
    from trainer.checkpoint import TrainerState
    from trainer.config import LoraSettings, TrainerConfig
    from trainer.learner import TorchLearner

    torch.set_num_threads(threads)
    config = TrainerConfig(run_id="bench", model=model, device="cpu", lr=1e-4, checkpoint_dir=work,
                           lora=LoraSettings(rank=rank, alpha=2 * rank) if mode == "lora" else None)
    learner = TorchLearner.load(config, torch.device("cpu"), None)
    vocab = int(learner.model.config.vocab_size)
    groups = []
    batch = BATCH[name]
    for g in range(batch["groups"]):
        events = synthetic_run(f"bench{g}", 1, 4, calls=(1, 2), seed=g, vocab=vocab,
                               prompt_tokens=batch["prompt_tokens"], response_tokens=batch["response_tokens"])
        groups += rebuild(events, f"bench{g}", Policy())
    scored = ScoredGroups.of(groups)
    learner.update(scored, 0)  # warm-up: allocations and the optimiser's state
    seconds = []
    for version in range(1, updates + 1):
        started = time.perf_counter()
        learner.update(scored, version)
        seconds.append(time.perf_counter() - started)
    started = time.perf_counter()
    staged = learner.stage(work, TrainerState(version=1))
    final = checkpoint.commit(work, staged, 1)
    stage_s = time.perf_counter() - started
    files = [p for p in final.rglob("*") if p.is_file() and p.name != "state.json"]
    weights = sum(p.stat().st_size for p in files if p.name != "optimizer.pt")
    optimiser = sum(p.stat().st_size for p in files if p.name == "optimizer.pt")
    engine = Engine(AutoModelForCausalLM.from_pretrained(model), AutoTokenizer.from_pretrained(model), base=model)
    engine.start()
    try:
        started = time.perf_counter()
        asyncio.run(engine.load_checkpoint(str(final), 1))
        handover_s = time.perf_counter() - started
    finally:
        engine.stop()
    trainable = sum(p.numel() for p in learner.model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in learner.model.parameters())
    return {"update_s": statistics.median(seconds), "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            / 1024, "weights_mb": weights / 2**20, "optimizer_mb": optimiser / 2**20, "stage_s": stage_s,
            "handover_s": handover_s, "trainable": trainable, "parameters": total}


def main() -> None:
    parser = arguments(__doc__, "lora.png")
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--updates", type=int, default=3)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1, help="torch's threads in each measured process")
    parser.add_argument("--child", nargs=4, metavar=("MODEL_DIR", "NAME", "MODE", "WORK"), help=argparse_hidden())
    args = parser.parse_args()
    if args.child:
        model, name, mode, work = args.child
        print(json.dumps(child(Path(model), name, mode, args.updates, args.rank, Path(work), args.threads)))
        return
    from tether.tiny_model import init_tiny

    scratch = Path(tempfile.mkdtemp(prefix="tether-lora-bench-"))
    figures: dict[str, dict[str, dict[str, Any]]] = {}
    try:
        for name in args.models:
            with console.status(f"building the {name} model..."):
                model = init_tiny(scratch / name, **MODELS[name])
            figures[name] = {}
            for mode in MODES:
                console.print(f"{name} / {mode}: {args.updates} updates, a checkpoint, a hand-over...")
                done = subprocess.run([sys.executable, __file__, "--updates", str(args.updates), "--rank",
                                       str(args.rank), "--threads", str(args.threads), "--child", str(model), name,
                                       mode, str(scratch / f"{name}-{mode}")],
                                      capture_output=True, text=True, check=False)
                if done.returncode != 0:
                    raise SystemExit(f"{name} / {mode} failed:\n{done.stderr[-3000:]}")
                figures[name][mode] = json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report(figures, args)


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


ROWS = (("update_s", "update (s, median)", "{:.3f}"), ("peak_mb", "peak memory (MB)", "{:,.0f}"),
        ("weights_mb", "checkpoint weights (MB)", "{:,.2f}"), ("optimizer_mb", "checkpoint optimiser (MB)",
                                                               "{:,.2f}"),
        ("stage_s", "checkpoint write (s)", "{:.3f}"), ("handover_s", "hand-over to the engine (s)", "{:.3f}"),
        ("trainable", "trainable parameters", "{:,}"))


def report(figures: dict[str, dict[str, dict[str, Any]]], args: Any) -> None:
    table = Table(title=f"LoRA (rank {args.rank}, all linear layers) against full weights, per update, one run")
    table.add_column("measure")
    for name in figures:
        params = figures[name]["full"]["parameters"]
        for column in ("full", "lora", "lora / full"):
            table.add_column(f"{name} ({params / 1e6:.1f}M): {column}", justify="right")
    for key, label, fmt in ROWS:
        cells = []
        for name in figures:
            full, lora = figures[name]["full"][key], figures[name]["lora"][key]
            cells += [fmt.format(full), fmt.format(lora), f"{lora / full:.3f}" if full else "-"]
        table.add_row(label, *cells)
    console.print(table)
    out: Path = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(figures, indent=1))
    plt = pyplot()
    keys = [k for k, _, _ in ROWS if k != "trainable"]
    fig, axes = plt.subplots(1, len(keys), figsize=(3.2 * len(keys), 3.4))
    for ax, key in zip(axes, keys, strict=True):
        names = list(figures)
        for offset, mode in enumerate(MODES):
            ax.bar([i + 0.38 * offset for i in range(len(names))], [figures[n][mode][key] for n in names],
                   width=0.38, label=mode, color=("#888", "#3a7")[offset])
        ax.set_xticks([i + 0.19 for i in range(len(names))], names)
        ax.set_yscale("log")
        ax.set_title(dict((k, label) for k, label, _ in ROWS)[key], fontsize=9)
    axes[0].legend()
    save(fig, out, console)


if __name__ == "__main__":
    main()
