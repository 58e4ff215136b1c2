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
import time
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

FIRST_ORDINARY = 3  # the tokenizer's special tokens come first


def teach_copying(model_dir: Path, out: Path, steps: int = 600, batch: int = 32, span: int = 24, lr: float = 1e-3,
                  seed: int = 0, on_step: Callable[[int, float], None] | None = None
                  ) -> tuple[Path, list[float], float]:
    """Train on repeated random spans; returns the saved model, the loss per step and the seconds it took."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa")
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    vocab = range(FIRST_ORDINARY, len(tokenizer))
    losses: list[float] = []
    started = time.perf_counter()
    model.train()
    for step in range(steps):
        rows = [[rng.choice(vocab) for _ in range(span)] for _ in range(batch)]
        ids = torch.tensor([row + row for row in rows])
        labels = ids.clone()
        labels[:, :span + 1] = -100  # the first run cannot be predicted, nor the repeat's first token
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(float(loss.detach()))
        if on_step is not None:
            on_step(step, losses[-1])
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out, losses, time.perf_counter() - started
