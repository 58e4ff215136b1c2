"""A base skill for the tiny random model: copying what it has read, taught on random tokens (no task, no format).

A real base model repeats a word from its context without effort; the tiny
random one cannot, and a format warm-start does not teach it: on the lookup
task (examples/lookup_task.py) the warm model put 0.08 of its probability on
the words the conversation had shown when it named one to look up. So before
any task it learns what induction heads do: rows of random tokens in which
short runs (2-8 tokens) repeat an earlier run at a random distance, and only
a repeat's tokens after its first are scored: predicting them means finding
where the current token appeared before and copying what followed it. The
distances vary on purpose: an earlier version repeated one fixed-length run,
which the model can predict from position alone, and that skill did not carry
over to the task.

It is slow to appear and then sudden: on this machine (batch 32, rows of 128,
lr 1e-3, one core, about 0.34 s a step) the loss on the repeats sat near 6.5
for 1,100 steps, fell to 1.8 by step 1,200 and to 0.29 by step 1,800; after a
500-step format warm-start on that model, the lookup agent put 0.87 of the
probability of a lookup's word on words it had seen (teacher-forced, the first
lookup of 40 tasks), 0.30 on the right one: about uniform over the three
shown. What to copy, and when, is still the policy's to learn.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tether.supervised import Batch, fit

FIRST_ORDINARY = 3  # the tokenizer's special tokens come first
NOT_SCORED = -100
RUN = (2, 8)  # a repeated run's length
NOISE = (1, 8)  # random tokens between repeats
REPEAT_ODDS = 0.35  # of each next piece being a repeat
WARM_UP = 12  # tokens before the first repeat can be drawn


def induction_row(rng: random.Random, vocab: int, length: int) -> tuple[list[int], list[int]]:
    """Random tokens with runs that repeat earlier ones at random distances; labels score a repeat's tokens
    after its first (the first cannot be known before it is seen)."""
    tokens: list[int] = []
    labels: list[int] = []
    while len(tokens) < length:
        if len(tokens) > WARM_UP and rng.random() < REPEAT_ODDS:
            size = rng.randint(*RUN)
            start = rng.randrange(0, len(tokens) - size)
            run = tokens[start:start + size]
            tokens += run
            labels += [NOT_SCORED, *run[1:]]
        else:
            noise = [rng.randrange(FIRST_ORDINARY, vocab) for _ in range(rng.randint(*NOISE))]
            tokens += noise
            labels += [NOT_SCORED] * len(noise)
    return tokens[:length], labels[:length]


def teach_copying(model_dir: Path, out: Path, steps: int = 1800, batch: int = 32, length: int = 128,
                  lr: float = 1e-3, seed: int = 0, on_step: Callable[[int, float], None] | None = None,
                  vocab: int | None = None) -> tuple[Path, list[float], float]:
    """Train on rows of repeated random runs (tokens below `vocab`, all of them by default); returns the saved
    model, the loss per step and the seconds it took."""
    rng = random.Random(seed)

    def batch_of(tokenizer: Any) -> Batch:
        rows = [induction_row(rng, vocab or len(tokenizer), length) for _ in range(batch)]
        return torch.tensor([r[0] for r in rows]), torch.tensor([r[1] for r in rows]), None

    return fit(model_dir, out, steps, lr, seed, batch_of, on_step)
