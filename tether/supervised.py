"""The supervised loop the tiny model's preparation shares: the copying skill and the format warm-start.

Each gives a function that draws one batch (input ids, labels with -100 where nothing is scored, attention
mask); this loads the model, takes the AdamW steps with the gradient clipped to 1, and saves model and tokenizer.
"""

from __future__ import annotations

import ast
import hashlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]
"""input ids, labels, attention mask (None: every position attends)."""


def fit(model_dir: Path, out: Path, steps: int, lr: float, seed: int, batch_of: Callable[[Any], Batch],
        on_step: Callable[[int, float], None] | None = None) -> tuple[Path, list[float], float]:
    """Train on `steps` batches from `batch_of(tokenizer)`; returns the saved model, the loss per step and the
    seconds it took."""
    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa")
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    losses: list[float] = []
    started = time.perf_counter()
    model.train()
    for step in range(steps):
        ids, labels, mask = batch_of(tokenizer)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
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


def recipe(*sources: Path) -> str:
    """A short hash of the Python files that make a prepared model: its cache folder is named by it, so a changed
    recipe trains again instead of reusing a model made otherwise. It hashes the code, not the text: comments,
    docstrings and layout do not count, so documenting a recipe does not throw its model away."""
    return hashlib.sha256("".join(_code(p.read_text()) for p in sources).encode()).hexdigest()[:8]


def _code(source: str) -> str:
    """The module's syntax tree without its docstrings (comments and layout are not in the tree)."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)
