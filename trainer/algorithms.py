"""Task-level advantages, loss normalisation and the PPO objective (docs/architecture.md). Pure tensor code.

verl supplies what it has: the GRPO estimator, the clipped surrogate
(`compute_policy_loss_vanilla`), `agg_loss`, `kl_penalty`. Written here is
what verl lacks: one advantage per rollout broadcast to every trainable token
of every segment, the per-task normalisation (each task weighs the same, each
rollout the same within its task, whatever its calls or tokens), and the
truncated importance weights for tokens sampled by older weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from omegaconf import OmegaConf
from verl.trainer.ppo import core_algos

LossMode = Literal["per-task", "token-mean", "seq-mean-token-mean"]


def rollout_advantages(rewards: list[list[float]], normalise_by_std: bool = True,
                       epsilon: float = 1e-6) -> list[list[float] | None]:
    """One advantage per rollout from its group's rewards (verl's GRPO estimator), per group.

    None for a group with no signal: fewer than two rollouts, or all rewards equal.
    """
    flat = [r for group in rewards for r in group]
    if not flat:
        return []
    index = np.array([g for g, group in enumerate(rewards) for _ in group])
    scores = torch.tensor(flat, dtype=torch.float32).unsqueeze(-1)
    advantages, _ = core_algos.compute_grpo_outcome_advantage(
        token_level_rewards=scores, response_mask=torch.ones_like(scores), index=index, epsilon=epsilon,
        norm_adv_by_std_in_grpo=normalise_by_std)
    out: list[list[float] | None] = []
    start = 0
    for group in rewards:
        values = advantages[start:start + len(group), 0].tolist()
        start += len(group)
        out.append(values if len(group) >= 2 and max(group) - min(group) > 1e-12 else None)
    return out


Credit = Literal["outcome", "per-call"]


def call_returns(seqs: list[int], step_rewards: dict[int, float], outcome: float, discount: float) -> dict[int, float]:
    """G_t for each call t of a rollout: its step reward plus the later ones discounted, the episode's outcome
    counting as the last call's. With no step rewards and discount 1 every call's return is the outcome."""
    ordered = sorted(set(seqs) | set(step_rewards))
    returns: dict[int, float] = {}
    g = 0.0
    for i, seq in enumerate(reversed(ordered)):
        g = step_rewards.get(seq, 0.0) + (outcome if i == 0 else 0.0) + discount * g
        returns[seq] = g
    return returns


def call_advantages(returns: list[list[dict[int, float]]], outcomes: list[list[float]], normalise_by_std: bool = True,
                    epsilon: float = 1e-6) -> list[list[tuple[dict[int, float], float]] | None]:
    """Per group, per rollout: each call's advantage, and the rollout's own (for tokens no call claims).

    The group baseline is taken over the rollouts' whole-episode returns (the first call's, or the outcome for a
    rollout without calls), mean and standard deviation as GRPO takes them, so that with no step rewards and
    discount 1 every call's advantage is the rollout's GRPO advantage. Where the episodes all returned the same
    but single calls did not, only the mean is taken off. None for a group with no signal at all."""
    out: list[list[tuple[dict[int, float], float]] | None] = []
    for group_returns, group_outcomes in zip(returns, outcomes, strict=True):
        episodes = [r[min(r)] if r else o for r, o in zip(group_returns, group_outcomes, strict=True)]
        every = episodes + [g for r in group_returns for g in r.values()]
        if len(episodes) < 2 or max(every) - min(every) <= 1e-12:
            out.append(None)
            continue
        scores = torch.tensor(episodes, dtype=torch.float64)
        mean, std = float(scores.mean()), float(scores.std())
        scale = std + epsilon if normalise_by_std and std > 1e-12 else 1.0
        out.append([({seq: (g - mean) / scale for seq, g in r.items()}, (e - mean) / scale)
                    for r, e in zip(group_returns, episodes, strict=True)])
    return out


def per_task_weights(tokens: list[list[int]]) -> list[list[float]]:
    """w_r = 1 / (|G| · |g| · T_r), so Σ_t w_r loss_t = (1/|G|) Σ_g (1/|g|) Σ_r (1/T_r) Σ_t loss_t.

    `tokens[g][r]`: trainable tokens of rollout r of group g. Rollouts without any count for nothing.
    """
    live = [[t for t in group if t > 0] for group in tokens]
    n_groups = sum(1 for group in live if group)
    return [[1.0 / (n_groups * len(live[g]) * t) if t > 0 else 0.0 for t in group]
            for g, group in enumerate(tokens)]


@dataclass(frozen=True, kw_only=True)
class LossConfig:
    mode: LossMode = "per-task"
    clip_low: float = 0.2
    clip_high: float = 0.28
    clip_dual: float = 3.0
    is_cap: float = 2.0  # truncation of π_prox/π_behaviour for stale tokens
    kl_coef: float = 0.0


def policy_loss(log_prob: torch.Tensor, prox_log_prob: torch.Tensor, behaviour_log_prob: torch.Tensor,
                advantages: torch.Tensor, mask: torch.Tensor, token_weights: torch.Tensor, config: LossConfig,
                batch_tokens: int, batch_sequences: int,
                ref_log_prob: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Decoupled PPO: the ratio against the policy at the start of the update (π_prox), clipped; each token
    weighted by min(π_prox/π_behaviour, is_cap), correcting for the weights that sampled it.

    Tensors are (rows, length); `mask` marks trainable tokens. In per-task mode `token_weights` carry the
    normalisation and the sum is taken; otherwise verl's `agg_loss` mode applies over the whole batch
    (`batch_tokens`, `batch_sequences`), so micro-batch losses add up to the batch loss.
    """
    mask = mask.to(log_prob.dtype)
    is_weights = torch.clamp(torch.exp(prox_log_prob - behaviour_log_prob), max=config.is_cap).detach() * mask
    per_task = config.mode == "per-task"
    weights = is_weights * token_weights if per_task else is_weights
    mode = "token-sum" if per_task else config.mode
    global_info = {"batch_num_tokens": batch_tokens, "global_batch_size": batch_sequences}
    verl_config = OmegaConf.create({"clip_ratio": config.clip_low, "clip_ratio_low": config.clip_low,
                                    "clip_ratio_high": config.clip_high, "clip_ratio_c": config.clip_dual,
                                    "global_batch_info": global_info})
    loss, metrics = core_algos.get_policy_loss_fn("vanilla")(
        old_log_prob=prox_log_prob, log_prob=log_prob, advantages=advantages, response_mask=mask,
        loss_agg_mode=mode, config=verl_config, rollout_is_weights=weights)
    out = {"clip_fraction": metrics["actor/pg_clipfrac"], "is_weight_mean": _masked_mean(is_weights, mask)}
    if ref_log_prob is not None:
        kl = core_algos.kl_penalty(log_prob, ref_log_prob, "low_var_kl")  # type: ignore[arg-type]
        kl_loss = core_algos.agg_loss(kl * (token_weights if per_task else 1.0), mask, mode, **global_info)
        out["kl"] = _masked_mean(kl.detach(), mask)
        if config.kl_coef:
            loss = loss + config.kl_coef * kl_loss
    return loss, out


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    total = mask.sum()
    return float((values * mask).sum() / total) if total > 0 else 0.0
