"""Which task groups an update takes, and which of those it trains on: pure, no I/O.

A group is *stale* when tokens in it were sampled more than `max_staleness`
versions before the update, and has *no signal* when its rewards are all equal
(nothing to learn from the group's relative advantages). An update takes the
next groups in the order the topic delivered them (so the trainer's offsets
stay a prefix):

- `fill: groups`: the next B groups, whatever they hold;
- `fill: signal`: groups until B of them can be trained on (fresh, with
  signal), or `max_fill_groups` in all if that comes first (DAPO's dynamic
  sampling: every update learns from B groups however rare a success is).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from schemas.events import TaskGroup
from trainer.advantages import OUTCOME, AdvantageRecipe, has_signal

Verdict = Literal["train", "stale", "no-signal"]
Fill = Literal["groups", "signal"]


@dataclass
class Selection:
    """What went into a batch and what did not, for metrics."""
    groups: list[TaskGroup] = field(default_factory=list)
    no_signal: int = 0  # groups whose rewards were all equal (or a single rollout)
    stale: int = 0  # groups older than max_staleness


def verdict(group: TaskGroup, version: int, max_staleness: int, recipe: AdvantageRecipe = OUTCOME) -> Verdict:
    """`version`: the trainer's before the update."""
    versions = [v for r in group.rollouts for s in r.segments
                for v, m in zip(s.weight_versions, s.loss_mask, strict=True) if m]
    if versions and version - min(versions) > max_staleness:
        return "stale"
    return "train" if has_signal(group, recipe) else "no-signal"


def select(groups: list[TaskGroup], version: int, max_staleness: int, zero_variance: str = "drop",
           recipe: AdvantageRecipe = OUTCOME) -> Selection:
    """Drop stale groups, and (by policy) no-signal groups."""
    out = Selection()
    for group in groups:
        found = verdict(group, version, max_staleness, recipe)
        if found == "stale":
            out.stale += 1
            continue
        if found == "no-signal":
            out.no_signal += 1
            if zero_variance == "drop":
                continue
        out.groups.append(group)
    return out


def batch_size(verdicts: Sequence[Verdict], batch_groups: int, fill: Fill, max_fill_groups: int) -> int | None:
    """How many of the buffered groups (their verdicts, in order) the next update takes; None: wait for more.

    `groups`: the first B. `signal`: the shortest prefix with B groups to train on, or the first
    `max_fill_groups` when no shorter prefix has them."""
    if fill == "groups":
        return batch_groups if len(verdicts) >= batch_groups else None
    trainable = 0
    for i, found in enumerate(verdicts[:max_fill_groups], start=1):
        trainable += found == "train"
        if trainable >= batch_groups:
            return i
    return max_fill_groups if len(verdicts) >= max_fill_groups else None
