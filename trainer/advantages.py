"""What each rollout and call of an update's task groups is given: the recipe, applied once per update.

The loop scores the chosen groups once (`ScoredGroups.of`); the backend's
batch takes each token's advantage from that, and `TrainerStep` publishes the
same numbers, so what the page shows is what was trained on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from schemas.events import CallAdvantage, RolloutAdvantage, RolloutSample, TaskGroup
from trainer.algorithms import Credit, call_advantages, call_returns, rollout_advantages


@dataclass(frozen=True, slots=True)
class AdvantageRecipe:
    """How rewards become advantages: the episode's outcome or each call's return (`credit`, later rewards
    discounted by `discount`), against the group's mean, divided by its standard deviation or not. `level`: the
    members of the group whose statistics are taken, the task's rollouts (Tether's task-level advantage) or all
    their recorded calls, each call a sample with its rollout's reward (the per-sample way, for comparison)."""
    normalise_by_std: bool = True
    credit: Credit = "outcome"
    discount: float = 1.0
    level: Literal["rollout", "sample"] = "rollout"


#: the defaults: GRPO on the episode's outcome
OUTCOME = AdvantageRecipe()


@dataclass(frozen=True, slots=True)
class Given:
    """One rollout's advantage, and (credit per call) that of each of its calls by seq."""
    rollout: float
    calls: dict[int, float]


@dataclass(frozen=True, slots=True)
class ScoredGroups:
    """Task groups and, per group and rollout in their order, what each is given (zero where a group has no
    signal)."""
    groups: list[TaskGroup]
    given: list[list[Given]]

    @classmethod
    def of(cls, groups: list[TaskGroup], recipe: AdvantageRecipe | None = None) -> ScoredGroups:
        recipe = recipe or OUTCOME
        if recipe.credit == "outcome" and recipe.level == "sample":
            return cls(groups, [_per_sample(g, recipe.normalise_by_std) for g in groups])
        if recipe.credit == "outcome":
            outcome = rollout_advantages([[r.reward for r in g.rollouts] for g in groups], recipe.normalise_by_std)
            return cls(groups, [[Given(a, {}) for a in (found or [0.0] * len(g.rollouts))]
                                for g, found in zip(groups, outcome, strict=True)])
        per_call = call_advantages(*_returns_of(groups, recipe.discount), normalise_by_std=recipe.normalise_by_std)
        return cls(groups, [[Given(own, calls) for calls, own in found] if found else
                            [Given(0.0, {})] * len(g.rollouts) for g, found in zip(groups, per_call, strict=True)])

    def published(self) -> list[RolloutAdvantage]:
        """As `TrainerStep` carries them."""
        return [RolloutAdvantage(group_id=group.group_id, rollout_id=rollout.rollout_id, advantage=given.rollout,
                                 calls=[CallAdvantage(seq=seq, advantage=value)
                                        for seq, value in sorted(given.calls.items())])
                for group, row in zip(self.groups, self.given, strict=True)
                for rollout, given in zip(group.rollouts, row, strict=True)]


def calls_of(rollout: RolloutSample) -> int:
    """How many samples a rollout is to a trainer that takes each recorded call as one: its calls (at least one)."""
    return max(1, sum(len(s.spans) for s in rollout.segments))


def _per_sample(group: TaskGroup, normalise_by_std: bool) -> list[Given]:
    """Each call a member of the group with its rollout's reward: GRPO over the samples, so a rollout of many
    calls counts many times in the baseline (and, under a token mean, in the loss)."""
    samples = [[r.reward] * calls_of(r) for r in group.rollouts]
    (found,) = rollout_advantages([[x for s in samples for x in s]], normalise_by_std)
    if found is None:
        return [Given(0.0, {})] * len(group.rollouts)
    starts = [sum(len(s) for s in samples[:i]) for i in range(len(samples))]
    return [Given(found[start], {}) for start in starts]


def has_signal(group: TaskGroup, recipe: AdvantageRecipe) -> bool:
    """Rewards that differ within the group (credit per call: returns of calls or episodes that differ)."""
    if recipe.credit == "per-call":
        return call_advantages(*_returns_of([group], recipe.discount))[0] is not None
    rewards = [r.reward for r in group.rollouts]
    return len(rewards) >= 2 and max(rewards) - min(rewards) > 1e-12


def _returns_of(groups: list[TaskGroup], discount: float) -> tuple[list[list[dict[int, float]]], list[list[float]]]:
    def returns(r: RolloutSample) -> dict[int, float]:
        seqs = [span.seq for s in r.segments for span in s.spans]
        return call_returns(seqs, {s.seq: s.reward for s in r.step_rewards}, r.reward, discount)
    return [[returns(r) for r in g.rollouts] for g in groups], [[r.reward for r in g.rollouts] for g in groups]
