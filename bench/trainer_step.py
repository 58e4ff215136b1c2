"""The update step on the tiny model for a fixed batch: packed rows against one padded row per segment.

    .venv/bin/python bench/trainer_step.py [--groups 8] [--group-size 4] [--repeats 3]

The batch: synthetic task groups whose rollouts make 1-4 calls with prompts of
100-1,500 tokens (lengths vary as agent transcripts do). Packed: segments
first-fit into rows no longer than the longest segment, with a block-diagonal
mask, each forward cut to its own row. Padded: one segment per row, four rows
per forward, all padded to the longest segment. Same loss, same optimiser;
prints the step time (median of --repeats), tokens/s, the padding share and
the ratio; writes bench/results/trainer_step.png.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table
from transformers import AutoModelForCausalLM

from _shared import pyplot, save

sys.path.insert(0, str(Path(__file__).parent.parent))  # the synthetic run generator lives with the tests
from stream_processors.grouping import Policy
from stream_processors.pipeline import rebuild
from tests.factories import synthetic_run
from tether.tiny_model import init_tiny
from trainer.advantages import ScoredGroups
from trainer.batch import build_batch
from trainer.step import StepConfig, update

console = Console(width=max(150, shutil.get_terminal_size().columns))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--row-tokens", type=int, default=None, help="default: the longest segment")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "trainer_step.png")
    args = parser.parse_args()
    torch.manual_seed(0)
    scratch = Path(tempfile.mkdtemp(prefix="tether-trainer-bench-"))
    try:
        model_dir = init_tiny(scratch / "tiny")
        vocab = AutoModelForCausalLM.from_pretrained(model_dir).config.vocab_size
        groups = []
        for g in range(args.groups):  # a run per group, so prompt lengths vary widely between groups
            events = synthetic_run(f"bench{g}", 1, args.group_size, calls=(1, 4), seed=g, vocab=vocab,
                                   prompt_tokens=100 + (g * 397) % 1400, response_tokens=80)
            groups += rebuild(events, f"bench{g}", Policy())
        rows = []
        layouts = (("packed", True, StepConfig()),
                   ("padded", False, StepConfig(rows_per_micro_batch=4, trim=False)))
        for name, pack, step in layouts:
            model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa")
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
            batch = build_batch(ScoredGroups.of(groups), row_tokens=args.row_tokens, pack=pack)
            real = sum(len(s.token_ids) - 1 for g in groups for r in g.rollouts for s in r.segments)
            cells = batch.batch["input_ids"].numel()
            times = []
            for _ in range(args.repeats):
                started = time.perf_counter()
                metrics = update(model, optimizer, batch, step, version=0)
                times.append(time.perf_counter() - started)
            seconds = statistics.median(times)
            rows.append((name, batch.batch["input_ids"].shape, cells, real, seconds, metrics.tokens))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    table = Table(title=f"Update step, tiny model, {args.groups} task groups x K={args.group_size} (CPU threads: "
                        f"{torch.get_num_threads()})")
    for column in ("layout", "rows x length", "padding", "step s", "tokens/s (all)", "trainable tokens/s"):
        table.add_column(column, justify="right")
    for name, shape, cells, real, seconds, trainable in rows:
        table.add_row(name, f"{shape[0]} x {shape[1]}", f"{1 - real / cells:.0%}", f"{seconds:.2f}",
                      f"{real / seconds:,.0f}", f"{trainable / seconds:,.0f}")
    console.print(table)
    ratio = rows[1][4] / rows[0][4]
    console.print(f"packed is {ratio:.2f}x faster than padded ({rows[0][3]:,} real tokens)")

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.bar([r[0] for r in rows], [r[3] / r[4] for r in rows], color=["#3a7", "#999"])
    ax.set(ylabel="tokens / s", title=f"update step: packed {ratio:.2f}x padded")
    save(fig, args.out, console)


if __name__ == "__main__":
    main()
