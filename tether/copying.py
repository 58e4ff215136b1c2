"""A base skill for the tiny random model: copying what it has read, taught on random tokens (no task, no format).

A real base model repeats a word from its context without effort; the tiny
random one cannot, and a short warm-start does not teach it: on the lookup
task (examples/lookup_task.py) 700 steps of format-only warm-start left its
loss at the floor of an agent that names words at random (0.25 per token,
against 0.16 if it copied), and its lookups named words it had never seen. So
before any task, it learns what induction heads do: each row is a run of
random tokens followed by the same run again, and only the repeat is scored.
It takes a few hundred steps (the loss falls from 7.0 to under 0.01 by step
1,000 on this machine, in about three minutes on one core). What to copy, and
when, is still the policy's to learn.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tether.supervised import Batch, fit

FIRST_ORDINARY = 3  # the tokenizer's special tokens come first


def teach_copying(model_dir: Path, out: Path, steps: int = 600, batch: int = 32, span: int = 24, lr: float = 1e-3,
                  seed: int = 0, on_step: Callable[[int, float], None] | None = None
                  ) -> tuple[Path, list[float], float]:
    """Train on repeated random spans; returns the saved model, the loss per step and the seconds it took."""
    rng = random.Random(seed)

    def batch_of(tokenizer: Any) -> Batch:
        rows = [[rng.randrange(FIRST_ORDINARY, len(tokenizer)) for _ in range(span)] for _ in range(batch)]
        ids = torch.tensor([row + row for row in rows])
        labels = ids.clone()
        labels[:, :span + 1] = -100  # the first run cannot be predicted, nor the repeat's first token
        return ids, labels, None

    return fit(model_dir, out, steps, lr, seed, batch_of, on_step)
