"""Advantages, normalisation and the objective (property tests), and an update that moves the policy as intended."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM

from schemas.events import RolloutSample, Segment, TaskGroup
from tests.factories import T0
from trainer.advantages import AdvantageRecipe, ScoredGroups
from trainer.algorithms import LossConfig, per_task_weights, policy_loss, rollout_advantages
from trainer.batch import build_batch
from trainer.selection import select
from trainer.step import StepConfig, token_log_probs, update

rewards = st.lists(st.floats(-5, 5, allow_nan=False), min_size=2, max_size=8)


@given(st.lists(rewards, min_size=1, max_size=5), st.booleans())
def test_advantages_sum_to_zero_within_a_group(groups: list[list[float]], by_std: bool) -> None:
    for group, advantages in zip(groups, rollout_advantages(groups, by_std), strict=True):
        if advantages is None:
            assert max(group) - min(group) <= 1e-12
            continue
        assert abs(sum(advantages)) < 1e-3 * len(group) * (1 + max(abs(a) for a in advantages))
        mean = sum(group) / len(group)
        clear = [(a, r) for a, r in zip(advantages, group, strict=True) if abs(r - mean) > 1e-6]  # sign well defined
        assert [a > 0 for a, _ in clear] == [r > mean for _, r in clear] or by_std


@given(st.lists(st.lists(st.integers(0, 50), min_size=1, max_size=6), min_size=1, max_size=6))
def test_each_task_weighs_the_same_whatever_its_tokens(tokens: list[list[int]]) -> None:
    weights = per_task_weights(tokens)
    live = [g for g, group in enumerate(tokens) if any(group)]
    for g in live:
        task_weight = sum(w * t for w, t in zip(weights[g], tokens[g], strict=True))
        assert math.isclose(task_weight, 1 / len(live))
        rollouts = [t for t in tokens[g] if t]
        for w, t in zip(weights[g], tokens[g], strict=True):
            if t:
                assert math.isclose(w * t, 1 / len(live) / len(rollouts))  # each rollout the same in its task


def group(gid: str, rollouts: list[tuple[float, list[Segment]]]) -> TaskGroup:
    return TaskGroup(group_id=gid, run_id="run", task_id=gid, group_size=len(rollouts), created_at=T0, rollouts=[
        RolloutSample(rollout_id=f"{gid}-{i}", reward=reward, status="succeeded", segments=segments)
        for i, (reward, segments) in enumerate(rollouts)])


def segment(prompt: int, response: int, start: int = 10, version: int = 0) -> Segment:
    n = prompt + response
    return Segment(token_ids=list(range(start, start + n)), loss_mask=[False] * prompt + [True] * response,
                   logprobs=[0.0] * prompt + [-1.0] * response, weight_versions=[version] * n)


@st.composite
def task_groups(draw: st.DrawFn) -> list[TaskGroup]:
    out = []
    for g in range(draw(st.integers(1, 4))):
        rollouts = []
        for r in range(draw(st.integers(2, 4))):
            segs = [segment(draw(st.integers(1, 6)), draw(st.integers(1, 8))) for _ in range(draw(st.integers(1, 3)))]
            rollouts.append((float(r % 2), segs))
        out.append(group(f"g{g}", rollouts))
    return out


def total_weight(groups: list[TaskGroup]) -> float:
    t = build_batch(ScoredGroups.of(groups)).batch
    return float((t["token_weights"] * t["loss_mask"]).sum())


@given(task_groups(), st.data())
def test_splitting_or_duplicating_a_rollouts_calls_keeps_its_tasks_weight(groups: list[TaskGroup],
                                                                           data: st.DataObject) -> None:
    assert math.isclose(total_weight(groups), 1.0, rel_tol=1e-5)  # every task 1/|G|, all tasks 1
    g = data.draw(st.integers(0, len(groups) - 1))
    r = data.draw(st.integers(0, len(groups[g].rollouts) - 1))
    rollout = groups[g].rollouts[r]
    longer = RolloutSample(rollout_id=rollout.rollout_id, reward=rollout.reward, status=rollout.status,
                           segments=[*rollout.segments, *rollout.segments, segment(3, 5)])  # more calls, more segments
    changed = [TaskGroup(group_id=x.group_id, run_id=x.run_id, task_id=x.task_id, group_size=x.group_size,
                         created_at=x.created_at,
                         rollouts=[longer if (i, j) == (g, r) else y for j, y in enumerate(x.rollouts)])
               for i, x in enumerate(groups)]
    t0, t1 = build_batch(ScoredGroups.of(groups)).batch, build_batch(ScoredGroups.of(changed)).batch
    for t in (t0, t1):
        assert math.isclose(float((t["token_weights"] * t["loss_mask"]).sum()), 1.0, rel_tol=1e-5)
    assert total_weight(changed) == pytest.approx(total_weight(groups))


def test_the_per_task_loss_by_hand() -> None:
    """Two tasks; ratio 1, no staleness: loss = mean over tasks of mean over rollouts of mean over tokens of -A."""
    groups = [group("a", [(1.0, [segment(2, 2)]), (0.0, [segment(2, 4)])]),
              group("b", [(1.0, [segment(1, 1)]), (0.0, [segment(1, 3)]), (0.0, [segment(1, 2)])])]
    t = build_batch(ScoredGroups.of(groups, AdvantageRecipe(normalise_by_std=False))).batch
    log_prob = torch.zeros_like(t["loss_mask"])
    loss, _ = policy_loss(log_prob, log_prob, log_prob, t["advantages"], t["loss_mask"], t["token_weights"],
                          LossConfig(is_cap=10.0), int(t["loss_mask"].sum()), 5)
    # a: advantages +0.5/-0.5 (mean-only), b: +2/3, -1/3, -1/3; each rollout's token mean of -A is -A.
    expected = 0.5 * (0.5 * (-0.5 + 0.5)) + 0.5 * ((-2 / 3 + 1 / 3 + 1 / 3) / 3)
    assert float(loss) == pytest.approx(expected, abs=1e-6)


@given(st.integers(1, 3), st.integers(4, 12), st.data())
def test_masked_tokens_have_no_gradient(rows: int, length: int, data: st.DataObject) -> None:
    mask = torch.tensor(data.draw(st.lists(st.lists(st.booleans(), min_size=length, max_size=length),
                                           min_size=rows, max_size=rows)), dtype=torch.float32)
    log_prob = torch.randn(rows, length, requires_grad=True)
    behaviour = log_prob.detach() + torch.randn(rows, length) * 0.3
    for mode in ("per-task", "token-mean", "seq-mean-token-mean"):
        log_prob.grad = None
        loss, _ = policy_loss(log_prob, log_prob.detach(), behaviour, torch.randn(rows, length), mask,
                              torch.rand(rows, length), LossConfig(mode=mode, kl_coef=0.1), max(int(mask.sum()), 1),
                              rows, ref_log_prob=behaviour)
        loss.backward()
        assert log_prob.grad is not None
        assert torch.all(log_prob.grad[mask == 0] == 0)


def test_stale_groups_are_dropped_and_counted() -> None:
    fresh = group("fresh", [(1.0, [segment(2, 2, version=5)]), (0.0, [segment(2, 2, version=5)])])
    old = group("old", [(1.0, [segment(2, 2, version=1)]), (0.0, [segment(2, 2, version=1)])])
    flat = group("flat", [(1.0, [segment(2, 2, version=5)]), (1.0, [segment(2, 2, version=5)])])
    chosen = select([fresh, old, flat], version=5, max_staleness=2)
    assert [g.group_id for g in chosen.groups] == ["fresh"] and (chosen.stale, chosen.no_signal) == (1, 1)


def test_packing_wastes_little_and_changes_nothing(tiny_model: Path) -> None:
    groups = [group(f"g{i}", [(1.0, [segment(3 + i, 5 + 2 * i, start=20)]), (0.0, [segment(4, 9, start=40)])])
              for i in range(4)]
    scored = ScoredGroups.of(groups)
    packed, padded = build_batch(scored, row_tokens=64), build_batch(scored, pack=False)
    assert packed.batch["input_ids"].numel() < padded.batch["input_ids"].numel()
    model = AutoModelForCausalLM.from_pretrained(tiny_model, attn_implementation="sdpa").eval()
    with torch.no_grad():
        a = token_log_probs(model, packed, 1.0)[0][packed.batch["loss_mask"] > 0]
        b = token_log_probs(model, padded, 1.0)[0][padded.batch["loss_mask"] > 0]
    assert sorted(a.tolist()) == pytest.approx(sorted(b.tolist()), abs=1e-4)


PROMPT, GOOD, BAD = [5, 17, 99, 42], [300, 301, 302], [700, 701, 702]


def scored(response: list[int], reward: float) -> tuple[float, list[Segment]]:
    ids = PROMPT + response
    return reward, [Segment(token_ids=ids, loss_mask=[False] * len(PROMPT) + [True] * len(response),
                            logprobs=[0.0] * len(ids), weight_versions=[0] * len(ids))]


def response_log_prob(model: Any, response: list[int]) -> float:
    b = build_batch(ScoredGroups.of([group("x", [scored(response, 1.0), scored(response, 0.0)])]))
    with torch.no_grad():
        lp = token_log_probs(model, b, 1.0)[0]
    return float((lp * b.batch["loss_mask"]).sum()) / 2


def good_vs_bad(model: Any) -> Any:
    batch = build_batch(ScoredGroups.of([group("x", [scored(GOOD, 1.0), scored(BAD, 0.0)])]))
    with torch.no_grad():  # behaviour = the current policy, as if it had just sampled these
        batch.batch["behaviour_log_probs"] = token_log_probs(model, batch, 1.0)[0]
    return batch


def test_an_update_moves_the_policy_toward_the_rewarded_rollout(tiny_model: Path) -> None:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, attn_implementation="sdpa")
    before_good, before_bad = response_log_prob(model, GOOD), response_log_prob(model, BAD)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(5):
        metrics = update(model, optimizer, good_vs_bad(model), StepConfig(), version=0)
        assert metrics.tokens == 6 and metrics.task_groups == 1 and metrics.optimizer_steps == 1
    assert response_log_prob(model, GOOD) > before_good + 0.5
    assert response_log_prob(model, BAD) < before_bad - 0.5


def test_epochs_and_mini_batches_reuse_a_batch_against_a_fixed_proximal_policy(tiny_model: Path) -> None:
    gains = {}
    for name, config in (("once", StepConfig()), ("reused", StepConfig(epochs=3, mini_batches=2))):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(tiny_model, attn_implementation="sdpa")
        before = response_log_prob(model, GOOD)
        metrics = update(model, torch.optim.AdamW(model.parameters(), lr=3e-2), good_vs_bad(model), config,
                         version=0)
        gains[name] = response_log_prob(model, GOOD) - before
        assert metrics.optimizer_steps == config.epochs * config.mini_batches
        # one step starts at π_prox (ratio 1, nothing clipped); later steps move away from it and get clipped
        assert (metrics.clip_fraction > 0) == (name == "reused")
    assert gains["reused"] > gains["once"] > 0
