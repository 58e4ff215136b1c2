"""One policy update on a Hugging Face causal LM: forward each packed row, loss, backward, clip, step.

With `epochs` * `mini_batches` > 1 (PPO's sample reuse: rollouts are the
expensive part) π_prox is the policy before the first step, computed once, and
each mini-batch's loss is scaled to a whole batch's so the step size does not
shrink with the split.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel
from verl import DataProto
from verl.utils.torch_functional import entropy_from_logits, logprobs_from_logits

from trainer.algorithms import LossConfig, policy_loss
from trainer.batch import attention_mask
from trainer.metrics import UpdateMetrics


@dataclass(frozen=True, kw_only=True)
class StepConfig:
    temperature: float = 1.0  # the sampling temperature: logprobs must be of the distribution that sampled
    max_grad_norm: float = 1.0
    rows_per_micro_batch: int = 1
    epochs: int = 1
    mini_batches: int = 1
    trim: bool = True  # cut each micro-batch to its own longest row (False: the padded baseline of the bench)
    loss: LossConfig = field(default_factory=LossConfig)


def token_log_probs(model: PreTrainedModel, rows: DataProto, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities of the targets, and the entropy, per position."""
    t = rows.batch
    logits = model(input_ids=t["input_ids"], position_ids=t["position_ids"],
                   attention_mask=attention_mask(t["segment_ids"])).logits.float() / temperature
    return logprobs_from_logits(logits, t["targets"]), entropy_from_logits(logits)


def reference_log_probs(model: PreTrainedModel, reference: PreTrainedModel | None, rows: DataProto,
                        temperature: float) -> torch.Tensor | None:
    """The KL reference's log-probabilities of the targets. A reference that is the policy itself is a policy with
    a low-rank adapter (`trainer/lora.py`): the reference is its base, the adapter switched off."""
    if reference is None:
        return None
    with torch.no_grad():
        if reference is model:
            with model.disable_adapter():  # type: ignore[operator]  # a PeftModel's context manager
                return token_log_probs(model, rows, temperature)[0]
        return token_log_probs(reference, rows, temperature)[0]


def trimmed(rows: DataProto) -> DataProto:
    """The rows without the padding columns they all share at the end."""
    used = (rows.batch["segment_ids"] >= 0).any(0).nonzero()
    length = int(used[-1]) + 1 if used.numel() else 1
    out: DataProto = DataProto.from_dict(tensors={k: v[:, :length] for k, v in rows.batch.items()},
                                         meta_info=rows.meta_info)
    return out


def update(model: PreTrainedModel, optimizer: torch.optim.Optimizer, batch: DataProto, config: StepConfig,
           version: int, reference: PreTrainedModel | None = None) -> UpdateMetrics:
    """`epochs` passes of `mini_batches` optimiser steps over the batch; returns the metrics of the steps."""
    started = time.perf_counter()
    device = next(model.parameters()).device
    batch = batch.to(device)
    t = batch.batch
    mask = t["loss_mask"]
    reuse = config.epochs * config.mini_batches > 1
    if reuse:  # π_prox: the policy before any step of this update
        model.eval()
        with torch.no_grad():
            t["prox_log_probs"] = torch.cat([token_log_probs(model, rows, config.temperature)[0] for rows in
                                             batch.split(config.rows_per_micro_batch)])
    model.train()
    totals = {"loss": 0.0, "entropy": 0.0, "clip_fraction": 0.0, "kl": 0.0, "is_weight_mean": 0.0, "grad_norm": 0.0}
    steps = 0
    rows_per_mini = -(-len(batch) // config.mini_batches)
    for _ in range(config.epochs):
        for mini in batch.split(rows_per_mini):
            if float(mini.batch["loss_mask"].sum()) == 0:
                continue
            step = _step(model, optimizer, mini, config, reference, prox=reuse, scale=_scale(batch, mini, config))
            steps += 1
            for key, value in step.items():
                totals[key] += value
    stale = (version - t["versions"]).float()[mask > 0]
    mean = {k: v / max(steps, 1) for k, v in totals.items()}
    return UpdateMetrics(
        loss=mean["loss"], entropy=mean["entropy"], clip_fraction=mean["clip_fraction"], kl=mean["kl"],
        is_weight_mean=mean["is_weight_mean"], grad_norm=mean["grad_norm"], optimizer_steps=steps,
        tokens=int(mask.sum()), task_groups=int(batch.meta_info.get("task_groups", 0)),
        staleness_mean=float(stale.mean()) if stale.numel() else 0.0,
        staleness_max=float(stale.max()) if stale.numel() else 0.0, seconds=time.perf_counter() - started)


def _scale(batch: DataProto, mini: DataProto, config: StepConfig) -> float:
    """Per-task token weights sum to 1 over the batch: a mini-batch's loss is scaled back to that mass."""
    if config.loss.mode != "per-task":
        return 1.0  # the other modes normalise by the mini-batch's own tokens or sequences
    return _mass(batch) / max(_mass(mini), 1e-12)


def _mass(d: DataProto) -> float:
    return float((d.batch["token_weights"] * d.batch["loss_mask"]).sum())


def _step(model: PreTrainedModel, optimizer: torch.optim.Optimizer, batch: DataProto, config: StepConfig,
          reference: PreTrainedModel | None, prox: bool, scale: float) -> dict[str, float]:
    """One optimiser step: micro-batches accumulate the gradient of the (mini-)batch loss."""
    mask = batch.batch["loss_mask"]
    n_tokens = int(mask.sum())
    n_sequences = int((mask.sum(-1) > 0).sum())
    optimizer.zero_grad(set_to_none=True)
    totals = {"loss": 0.0, "entropy": 0.0, "clip_fraction": 0.0, "kl": 0.0, "is_weight_mean": 0.0}
    for rows in batch.split(config.rows_per_micro_batch):
        if config.trim:
            rows = trimmed(rows)
        r = rows.batch
        share = float(r["loss_mask"].sum()) / max(n_tokens, 1)
        if share == 0:
            continue
        log_prob, entropy = token_log_probs(model, rows, config.temperature)
        ref = reference_log_probs(model, reference, rows, config.temperature)
        loss, metrics = policy_loss(
            log_prob=log_prob, prox_log_prob=r["prox_log_probs"] if prox else log_prob.detach(),
            behaviour_log_prob=r["behaviour_log_probs"], advantages=r["advantages"], mask=r["loss_mask"],
            token_weights=r["token_weights"], config=config.loss, batch_tokens=n_tokens,
            batch_sequences=n_sequences, ref_log_prob=ref)
        (loss * scale).backward()
        totals["loss"] += float(loss.detach()) * scale
        totals["entropy"] += float((entropy.detach() * r["loss_mask"]).sum()) / max(n_tokens, 1)
        for key in ("clip_fraction", "kl", "is_weight_mean"):
            totals[key] += metrics.get(key, 0.0) * share
    grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm))
    if math.isfinite(grad_norm):
        optimizer.step()
    return {**totals, "grad_norm": grad_norm}
