"""Turning a batch of next-token logits into tokens and the logprobs of the distribution sampled from.

The returned logprob of a token is log p(token) under exactly the distribution
the token was drawn from: softmax(logits / temperature), renormalised over the
top-p nucleus when top_p < 1. With top_p = 1 that is what the trainer
recomputes from a plain forward pass at the same temperature. Greedy rows
(temperature 0) report the model's own distribution, softmax(logits).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    top_logprobs: int = 0


@dataclass(frozen=True)
class Sampled:
    tokens: torch.Tensor  # [B] long
    logprobs: torch.Tensor  # [B] float: logprob of each sampled token
    top_ids: torch.Tensor  # [B, K] long, K = max top_logprobs in the batch (may be 0)
    top_logprobs: torch.Tensor  # [B, K] float


def distribution(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor,
                 any_nucleus: bool | None = None) -> torch.Tensor:
    """Log-probabilities each row samples from: [B, V] logits, [B] temperature (0 = greedy), [B] top_p."""
    logits = logits.float()
    scale = torch.where(temperature > 0, temperature, torch.ones_like(temperature))
    logp = torch.log_softmax(logits / scale[:, None], dim=-1)
    nucleus = (top_p < 1.0) & (temperature > 0)
    if any_nucleus if any_nucleus is not None else bool(nucleus.any()):
        sorted_logp, order = logp.sort(dim=-1, descending=True)
        before = sorted_logp.exp().cumsum(dim=-1) - sorted_logp.exp()  # mass of strictly better tokens
        drop_sorted = (before >= top_p[:, None]) & nucleus[:, None]
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logp = torch.log_softmax(logp.masked_fill(drop, float("-inf")), dim=-1)
    return logp


def sample(logits: torch.Tensor, params: list[SamplingParams], rngs: list[random.Random]) -> Sampled:
    """One token per row, drawn with that row's own random stream (seeded requests have their own, so they
    are reproducible whatever else is in the batch)."""
    device = logits.device
    temperatures = [p.temperature for p in params]
    temperature = torch.tensor(temperatures, device=device, dtype=torch.float32)
    top_p = torch.tensor([p.top_p for p in params], device=device, dtype=torch.float32)
    any_nucleus = any(p.top_p < 1.0 and p.temperature > 0 for p in params)  # decided here: no device sync
    logp = distribution(logits, temperature, top_p, any_nucleus)
    # Inverse-CDF sampling needs one uniform number per row, not one per vocabulary entry.
    uniform = torch.tensor([[rng.random()] for rng in rngs], dtype=torch.float32, device=device)
    cdf = logp.exp().cumsum(dim=-1)
    drawn = torch.searchsorted(cdf, uniform * cdf[:, -1:], right=True).squeeze(-1).clamp_(max=logp.shape[1] - 1)
    greedy = any(t == 0 for t in temperatures)
    tokens = torch.where(temperature > 0, drawn, logp.argmax(dim=-1)) if greedy else drawn
    k = max((p.top_logprobs for p in params), default=0)
    top = logp.topk(k, dim=-1) if k else None
    empty = torch.empty(len(params), 0, device=device)
    return Sampled(
        tokens=tokens,
        logprobs=logp.gather(-1, tokens[:, None]).squeeze(-1),
        top_ids=top.indices if top is not None else empty.long(),
        top_logprobs=top.values if top is not None else empty,
    )
