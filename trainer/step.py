"""One policy update on a Hugging Face causal LM: forward each packed row, loss, backward, clip, step."""

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


@dataclass(frozen=True)
class StepConfig:
    temperature: float = 1.0  # the sampling temperature: logprobs must be of the distribution that sampled
    max_grad_norm: float = 1.0
    rows_per_micro_batch: int = 1
    trim: bool = True  # cut each micro-batch to its own longest row (False: the padded baseline of the bench)
    loss: LossConfig = field(default_factory=LossConfig)


def token_log_probs(model: PreTrainedModel, rows: DataProto, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities of the targets, and the entropy, per position."""
    t = rows.batch
    logits = model(input_ids=t["input_ids"], position_ids=t["position_ids"],
                   attention_mask=attention_mask(t["segment_ids"])).logits.float() / temperature
    return logprobs_from_logits(logits, t["targets"]), entropy_from_logits(logits)


def trimmed(rows: DataProto) -> DataProto:
    """The rows without the padding columns they all share at the end."""
    used = (rows.batch["segment_ids"] >= 0).any(0).nonzero()
    length = int(used[-1]) + 1 if used.numel() else 1
    out: DataProto = DataProto.from_dict(tensors={k: v[:, :length] for k, v in rows.batch.items()},
                                         meta_info=rows.meta_info)
    return out


def update(model: PreTrainedModel, optimizer: torch.optim.Optimizer, batch: DataProto, config: StepConfig,
           version: int, reference: PreTrainedModel | None = None) -> dict[str, float]:
    """One optimiser step over the whole batch; returns the step's metrics."""
    started = time.perf_counter()
    device = next(model.parameters()).device
    batch = batch.to(device)
    t = batch.batch
    mask = t["loss_mask"]
    n_tokens = int(mask.sum())
    n_sequences = int((mask.sum(-1) > 0).sum())
    model.train()
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
        ref = None
        if reference is not None:
            with torch.no_grad():
                ref = token_log_probs(reference, rows, config.temperature)[0]
        loss, metrics = policy_loss(
            log_prob=log_prob, prox_log_prob=log_prob.detach(), behaviour_log_prob=r["behaviour_log_probs"],
            advantages=r["advantages"], mask=r["loss_mask"], token_weights=r["token_weights"], config=config.loss,
            batch_tokens=n_tokens, batch_sequences=n_sequences, ref_log_prob=ref)
        loss.backward()
        totals["loss"] += float(loss.detach())
        totals["entropy"] += float((entropy.detach() * r["loss_mask"]).sum()) / max(n_tokens, 1)
        for key in ("clip_fraction", "kl", "is_weight_mean"):
            totals[key] += metrics.get(key, 0.0) * share
    grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm))
    if math.isfinite(grad_norm):
        optimizer.step()
    stale = (version - t["versions"]).float()[mask > 0]
    return {**totals, "grad_norm": grad_norm, "tokens": float(n_tokens),
            "task_groups": float(batch.meta_info.get("task_groups", 0)),
            "staleness_mean": float(stale.mean()) if stale.numel() else 0.0,
            "staleness_max": float(stale.max()) if stale.numel() else 0.0,
            "seconds": time.perf_counter() - started}
