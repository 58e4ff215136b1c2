"""Credit per call: step rewards, discounted returns, the group baseline (property tests), from events to tokens."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import torch
from hypothesis import given
from hypothesis import strategies as st

from controller.plan import RunState
from schemas.events import (
    CallSpan,
    ModelCall,
    RewardReported,
    RolloutFinished,
    RolloutSample,
    RolloutSealed,
    RolloutStarted,
    StepReward,
    TaskGroup,
)
from stream_processors.assembly import Call, assemble
from stream_processors.join import RolloutJoin, call_of
from tests.factories import T0, example
from trainer.advantages import AdvantageRecipe, ScoredGroups
from trainer.algorithms import Credit, call_advantages, call_returns, rollout_advantages
from trainer.batch import build_batch
from trainer.selection import select

reward = st.floats(-5, 5, allow_nan=False)
steps = st.dictionaries(st.integers(0, 6), reward, max_size=7)
discount = st.floats(0.05, 1.0)


@given(st.lists(st.integers(0, 6), min_size=1, max_size=7, unique=True), steps, reward, discount)
def test_returns_follow_the_recurrence(seqs: list[int], step_rewards: dict[int, float], outcome: float,
                                       gamma: float) -> None:
    returns = call_returns(seqs, step_rewards, outcome, gamma)
    ordered = sorted(returns)
    last = ordered[-1]
    assert math.isclose(returns[last], step_rewards.get(last, 0.0) + outcome, abs_tol=1e-9)
    for here, after in itertools.pairwise(ordered):
        assert math.isclose(returns[here], step_rewards.get(here, 0.0) + gamma * returns[after], abs_tol=1e-9)


@given(st.lists(st.integers(0, 6), min_size=2, max_size=7, unique=True), steps, reward, discount, reward)
def test_a_step_reward_credits_only_the_calls_up_to_it(seqs: list[int], step_rewards: dict[int, float],
                                                        outcome: float, gamma: float, extra: float) -> None:
    at = sorted(seqs)[len(seqs) // 2]
    before = call_returns(seqs, step_rewards, outcome, gamma)
    after = call_returns(seqs, {**step_rewards, at: step_rewards.get(at, 0.0) + extra}, outcome, gamma)
    assert all(math.isclose(before[s], after[s], abs_tol=1e-9) for s in before if s > at)


@given(st.lists(st.lists(reward, min_size=2, max_size=6), min_size=1, max_size=4),
       st.lists(st.integers(1, 5), min_size=1, max_size=4), st.booleans())
def test_without_step_rewards_every_call_gets_its_rollouts_outcome_advantage(
        groups: list[list[float]], calls: list[int], by_std: bool) -> None:
    returns = [[call_returns(list(range(calls[g % len(calls)])), {}, r, 1.0) for r in group]
               for g, group in enumerate(groups)]
    per_call = call_advantages(returns, groups, by_std)
    for found, expected in zip(per_call, rollout_advantages(groups, by_std), strict=True):
        assert (found is None) == (expected is None)
        for (by_call, own), a in zip(found or [], expected or [], strict=True):
            assert all(math.isclose(v, a, rel_tol=1e-4, abs_tol=1e-4) for v in [own, *by_call.values()])


@given(st.lists(st.tuples(steps, reward), min_size=2, max_size=6), discount, st.booleans())
def test_the_episodes_advantages_are_centred_on_the_group(rollouts: list[tuple[dict[int, float], float]],
                                                          gamma: float, by_std: bool) -> None:
    returns = [call_returns([0, 1, 2], s, r, gamma) for s, r in rollouts]
    (found,) = call_advantages([returns], [[r for _, r in rollouts]], by_std)
    if found is not None:
        episodes = [own for _, own in found]
        assert abs(sum(episodes)) < 1e-6 * len(episodes) * (1 + max(abs(e) for e in episodes))


def _call(seq: int, prompt: list[int], response: list[int]) -> Call:
    return Call(f"call-{seq}-0", seq, 0, prompt, response, [-0.5] * len(response), 0)


def test_spans_mark_each_calls_response_in_the_segment() -> None:
    (segment,) = assemble([_call(0, [1, 2], [3, 4]), _call(1, [1, 2, 3, 4, 5], [6, 7, 8])])
    assert segment.spans == [CallSpan(seq=0, start=2, end=4), CallSpan(seq=1, start=5, end=8)]
    for span, response in zip(segment.spans, ([3, 4], [6, 7, 8]), strict=True):
        assert segment.token_ids[span.start:span.end] == response
        assert all(segment.loss_mask[span.start:span.end])


def test_the_join_keeps_step_rewards_of_the_sealed_calls_by_seq() -> None:
    call = replace(example(ModelCall, rollout_id="r-1"), call_id="call-abc-0", seq=3)
    join = RolloutJoin("r-1")
    for event in (example(RolloutStarted, rollout_id="r-1"), call,
                  replace(example(RolloutSealed, rollout_id="r-1"), call_ids=[call.call_id]),
                  example(RolloutFinished, rollout_id="r-1")):
        join.apply(event)
    for call_id, value in (("call-abc", 0.25), ("call-abc-0", 9.0), ("call-unknown", 5.0)):
        join.apply(RewardReported(rollout_id="r-1", run_id=call.run_id, reward=value, source="harness",
                                  call_id=call_id))
    result = join.result({call.call_id: call_of(call)})
    assert result.step_rewards == [StepReward(seq=3, reward=0.25)]  # named either way, the first counts
    assert join.reward is None  # a step reward is not the rollout's
    assert result.segments[0].spans == [CallSpan(seq=3, start=len(call.prompt_token_ids),
                                                 end=len(call.prompt_token_ids) + len(call.response_token_ids))]


def _rollout(rid: str, outcome: float, step_rewards: dict[int, float]) -> RolloutSample:
    segment = assemble([_call(0, [1, 2], [3, 4]), _call(1, [1, 2, 3, 4, 5], [6, 7])])[0]
    return RolloutSample(rollout_id=rid, reward=outcome, status="succeeded", segments=[segment],
                         step_rewards=[StepReward(seq=s, reward=r) for s, r in step_rewards.items()])


def test_credit_per_call_reaches_the_tokens_and_finds_signal_the_outcome_lacks() -> None:
    """Both rollouts end with reward 1, but the first was rewarded for its first call: only per-call sees it."""
    group = TaskGroup(group_id="g", run_id="run", task_id="t", group_size=2, created_at=T0,
                      rollouts=[_rollout("a", 1.0, {0: 1.0}), _rollout("b", 1.0, {})])
    assert select([group], 0, 2).no_signal == 1 and not select([group], 0, 2).groups
    assert select([group], 0, 2, recipe=AdvantageRecipe(credit="per-call")).groups == [group]
    batch = build_batch(ScoredGroups.of([group], AdvantageRecipe(credit="per-call", discount=0.5)), pack=False)
    advantages, mask = batch.batch["advantages"], batch.batch["loss_mask"].bool()
    # Returns (discount 0.5): a 1.5 then 1, b 0.5 then 1; the baseline is the episodes' (1.5 and 0.5): mean 1, std
    # 0.707. The first calls get +-0.5 / 0.707; the second calls both returned 1, the mean: nothing to learn there.
    a = 0.5 / math.sqrt(0.5)
    expected = torch.tensor([[a, a, 0.0, 0.0], [-a, -a, 0.0, 0.0]])
    assert torch.allclose(torch.stack([advantages[i][mask[i]] for i in range(2)]), expected, atol=1e-4)
    outcome = build_batch(ScoredGroups.of([group]), pack=False)
    assert torch.count_nonzero(outcome.batch["advantages"]) == 0  # equal outcomes: nothing to learn


def test_the_controller_takes_a_step_reward_for_no_rollouts_reward() -> None:
    started = example(RolloutStarted, rollout_id="r-1")
    state = RunState(run_id=started.run_id, group_size=started.group_size, max_attempts=1)
    state.apply(started)
    state.apply(RewardReported(rollout_id="r-1", run_id=started.run_id, reward=0.5, source="harness", call_id="c"))
    assert state.rollouts["r-1"].reward is None
    state.apply(RewardReported(rollout_id="r-1", run_id=started.run_id, reward=1.0, source="harness"))
    assert state.rollouts["r-1"].reward is not None and state.rollouts["r-1"].reward.reward == 1.0


@given(st.lists(st.tuples(reward, steps), min_size=2, max_size=5), st.sampled_from(["outcome", "per-call"]),
       discount, st.booleans())
def test_the_published_advantages_are_those_the_tokens_carry(rollouts: list[tuple[float, dict[int, float]]],
                                                            credit: Credit, gamma: float, by_std: bool) -> None:
    group = TaskGroup(group_id="g", run_id="run", task_id="t", group_size=len(rollouts), created_at=T0,
                      rollouts=[_rollout(f"r{i}", outcome, {s: v for s, v in step.items() if s < 2})
                                for i, (outcome, step) in enumerate(rollouts)])
    scored = ScoredGroups.of([group], AdvantageRecipe(normalise_by_std=by_std, credit=credit, discount=gamma))
    given_ = scored.published()
    assert [(a.group_id, a.rollout_id) for a in given_] == [("g", r.rollout_id) for r in group.rollouts]
    batch = build_batch(scored, pack=False)
    advantages, mask = batch.batch["advantages"], batch.batch["loss_mask"].bool()
    for row, published in enumerate(given_):  # one segment per row, in the group's order (all of one length)
        by_call = {c.seq: c.advantage for c in published.calls}
        spans = group.rollouts[row].segments[0].spans
        expected = [by_call.get(span.seq, published.advantage) for span in spans for _ in range(span.end - span.start)]
        assert torch.allclose(advantages[row][mask[row]], torch.tensor(expected, dtype=advantages.dtype), atol=1e-6)


def _with_calls(rid: str, outcome: float, calls: int) -> RolloutSample:
    spans = [CallSpan(seq=s, start=2 * s, end=2 * s + 1) for s in range(calls)]
    segment = assemble([_call(0, [1], [2])])[0]
    return RolloutSample(rollout_id=rid, reward=outcome, status="succeeded",
                         segments=[replace(segment, token_ids=[1] * (2 * calls), loss_mask=[True] * (2 * calls),
                                           logprobs=[0.0] * (2 * calls), weight_versions=[0] * (2 * calls),
                                           spans=spans)])


@given(st.lists(st.tuples(reward, st.integers(1, 6)), min_size=2, max_size=6))
def test_per_sample_advantages_are_grpo_over_the_calls(members: list[tuple[float, int]]) -> None:
    """Each call is a member with its rollout's reward: the baseline is the call-weighted mean, so a rollout of
    many calls pulls it towards its own reward; with one call each it is the task-level advantage."""
    group = TaskGroup(group_id="g", run_id="r", task_id="t", group_size=len(members),
                      rollouts=[_with_calls(f"r{i}", o, n) for i, (o, n) in enumerate(members)])
    given_ = ScoredGroups.of([group], AdvantageRecipe(level="sample")).given[0]
    samples = [o for o, n in members for _ in range(n)]
    (expected,) = rollout_advantages([samples])
    if expected is None:
        assert all(g.rollout == 0.0 for g in given_)
        return
    firsts = list(itertools.accumulate([0] + [n for _, n in members[:-1]]))
    assert [g.rollout for g in given_] == [expected[i] for i in firsts]
    weighted = sum(g.rollout * n for g, (_, n) in zip(given_, members, strict=True))
    assert math.isclose(weighted, 0.0, abs_tol=1e-3 * len(samples))  # centred over the samples, not the rollouts
    single = TaskGroup(group_id="g", run_id="r", task_id="t", group_size=len(members),
                       rollouts=[_with_calls(f"r{i}", o, 1) for i, (o, _) in enumerate(members)])
    assert [g.rollout for g in ScoredGroups.of([single], AdvantageRecipe(level="sample")).given[0]] == \
        [g.rollout for g in ScoredGroups.of([single]).given[0]]
