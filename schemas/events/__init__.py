"""Typed events of the contract (docs/architecture.md, "Event contract").

Each class mirrors the `.avsc` file of the same name; `registry.py` is the one
place that ties them together. Invariants that every reader relies on are
checked at construction, so an invalid event can be neither produced nor
decoded (it goes to the dead-letter topic instead). One module per part of the
system that writes them:

    rollouts      RolloutStarted, ModelCall (with Sampling, Usage, Timings), RolloutSealed, RewardReported,
                  RolloutFinished
    samples       TaskGroup (RolloutSample, Segment, CallSpan, StepReward, DroppedRollout)
    updates       UpdateRequested, GatewayDrained, WeightVersionPublished, UpdateAborted, GatewayJoined,
                  GatewayLeft
    validation    ValidationStarted, ValidationReported (ValidationScore)
    training      TrainerStep (RolloutAdvantage, CallAdvantage)
    dead_letters  DeadLetter
"""

from __future__ import annotations

from schemas.events._checks import CALL_STATUSES, ROLLOUT_STATUSES, utcnow
from schemas.events.dead_letters import DeadLetter
from schemas.events.rollouts import (
    ModelCall,
    RewardReported,
    RolloutFinished,
    RolloutSealed,
    RolloutStarted,
    Sampling,
    Timings,
    Usage,
)
from schemas.events.samples import CallSpan, DroppedRollout, RolloutSample, Segment, StepReward, TaskGroup
from schemas.events.training import CallAdvantage, RolloutAdvantage, TrainerStep
from schemas.events.updates import (
    GatewayDrained,
    GatewayJoined,
    GatewayLeft,
    UpdateAborted,
    UpdateRequested,
    WeightVersionPublished,
)
from schemas.events.validation import ValidationReported, ValidationScore, ValidationStarted

__all__ = [
    "CALL_STATUSES", "ROLLOUT_STATUSES", "CallAdvantage", "CallSpan", "DeadLetter", "DroppedRollout", "Event",
    "GatewayDrained", "GatewayJoined", "GatewayLeft", "ModelCall", "RewardReported", "RolloutAdvantage",
    "RolloutEvent", "RolloutFinished", "RolloutSample", "RolloutSealed", "RolloutStarted", "Sampling", "Segment",
    "StepReward", "TaskGroup", "Timings", "TrainerStep", "UpdateAborted", "UpdateRequested", "Usage",
    "ValidationReported", "ValidationScore", "ValidationStarted", "WeightVersionPublished", "rollout_of", "run_of",
    "utcnow",
]

Event = (
    ModelCall
    | RolloutSealed
    | RolloutStarted
    | RewardReported
    | RolloutFinished
    | TaskGroup
    | UpdateRequested
    | GatewayDrained
    | WeightVersionPublished
    | UpdateAborted
    | GatewayJoined
    | GatewayLeft
    | TrainerStep
    | ValidationStarted
    | ValidationReported
    | DeadLetter
)


def run_of(event: Event) -> str | None:
    """The run an event belongs to; None for the one event that belongs to none (a dead letter)."""
    return None if isinstance(event, DeadLetter) else event.run_id


RolloutEvent = ModelCall | RolloutSealed | RolloutStarted | RewardReported | RolloutFinished


def rollout_of(event: Event) -> str | None:
    """The rollout an event is about, for the events that tether.calls and tether.rollouts carry."""
    return event.rollout_id if isinstance(event, RolloutEvent) else None
