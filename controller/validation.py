"""Held-out validation: which weight versions are validated, the groups of a round, and its score. Pure.

A round validates one weight version: every held-out task, in every sampling
setting, `samples` times, with the run's own harness through the gateway (the
rollout's token pins the setting's temperature). Version 0 (before any
update), every `every`-th version and the trainer's final one are validated.
The controller announces a round with ValidationStarted and closes it with
ValidationReported; the trainer requests no update in between, so every call
of a round is served by the version it validates.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from schemas.events import ValidationReported, ValidationScore, ValidationStarted

GREEDY, HARNESS = "greedy", "harness"


@dataclass(frozen=True)
class Setting:
    """One way of sampling the held-out tasks: greedy, a pinned temperature, or the harness's own."""
    temperature: float | None

    @property
    def name(self) -> str:
        if self.temperature is None:
            return HARNESS
        return GREEDY if self.temperature == 0 else f"t={self.temperature:g}"

    @property
    def slug(self) -> str:
        """The name as a piece of a rollout id."""
        return re.sub(r"[^A-Za-z0-9]", "_", self.name.replace("=", ""))


def settings_of(temperatures: Sequence[float | None]) -> list[Setting]:
    return [Setting(t) for t in temperatures]


def due(version: int, every: int, final: bool) -> bool:
    """Whether a version is validated: the first, every `every`-th, and the last."""
    return version == 0 or version % every == 0 or final


def group_key(version: int, setting: Setting) -> str:
    """What stands for the task group's run-level name in a validation group's id: one per round and setting."""
    return f"val{version}-{setting.slug}"


@dataclass
class Round:
    """One version's validation, as the log has it."""
    version: int
    started: ValidationStarted | None = None
    reported: ValidationReported | None = None

    @property
    def open(self) -> bool:
        return self.started is not None and self.reported is None


@dataclass(frozen=True)
class Outcome:
    """What scoring needs of one finished validation rollout."""
    status: str
    reward: float | None
    duration_s: float


def score(setting: Setting, outcomes: Sequence[Outcome]) -> ValidationScore:
    """The setting's mean reward over its rollouts; one that ended without a reward (the harness failed or
    timed out) counts 0, so a policy that breaks the harness does not look better for it."""
    rewards = [o.reward if o.reward is not None else 0.0 for o in outcomes]
    return ValidationScore(
        setting=setting.name, temperature=setting.temperature, rollouts=len(outcomes),
        mean_reward=sum(rewards) / len(rewards) if rewards else 0.0,
        unrewarded=sum(1 for o in outcomes if o.reward is None),
        duration_s=sum(o.duration_s for o in outcomes) / len(outcomes) if outcomes else 0.0)
