"""Typed events of the contract (docs/architecture.md, "Event contract").

Each class mirrors the `.avsc` file of the same name; `registry.py` is the one
place that ties them together. Invariants that every reader relies on are
checked at construction, so an invalid event can be neither produced nor
decoded (it goes to the dead-letter topic instead).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime

from schemas.errors import InvalidEvent

ROLLOUT_STATUSES = frozenset({"succeeded", "failed", "timeout", "cancelled", "lost"})
CALL_STATUSES = frozenset({"ok", "error"})
_ROLLOUT_STATUS = f"status must be one of {sorted(ROLLOUT_STATUSES)}"
_CALL_STATUS = f"status must be one of {sorted(CALL_STATUSES)}"


def utcnow() -> datetime:
    return datetime.now(UTC)


def _require(ok: bool, event: object, message: str) -> None:
    if not ok:
        raise InvalidEvent(f"{type(event).__name__}: {message}")


def _require_ids(event: object, *names: str) -> None:
    for name in names:
        if not getattr(event, name):  # the message is built only for a failure: events are built by the thousand
            _require(False, event, f"{name} must not be empty")


def _require_aware(event: object, *names: str) -> None:
    for name in names:
        if getattr(event, name).tzinfo is None:
            _require(False, event, f"{name} must be timezone-aware")


@dataclass(frozen=True, slots=True, kw_only=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Timings:
    received_at: datetime
    finished_at: datetime
    queued_ms: float = 0.0
    engine_ms: float = 0.0

    def __post_init__(self) -> None:
        _require_aware(self, "received_at", "finished_at")


@dataclass(frozen=True, slots=True, kw_only=True)
class Sampling:
    temperature: float
    top_p: float
    max_tokens: int
    seed: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelCall:
    call_id: str
    rollout_id: str
    run_id: str
    gateway_id: str
    seq: int
    api: str
    model: str
    request_json: str
    response_json: str
    prompt_token_ids: list[int]
    response_token_ids: list[int]
    response_logprobs: list[float]
    weight_version: int
    sampling: Sampling
    usage: Usage
    timings: Timings
    choice_index: int = 0
    status: str = "ok"
    http_status: int = 200
    finish_reason: str | None = None
    error: str | None = None
    turn_key: str | None = None
    #: an earlier call of the rollout whose prompt and response this prompt starts with: then `prompt_token_ids`
    #: are only the tokens after them, and `request_json` the middle of the request between `request_head` and
    #: `request_tail` characters of that call's (`schemas.calls` makes a call whole again)
    extends: str | None = None
    request_head: int = 0
    request_tail: int = 0

    def __post_init__(self) -> None:
        _require_ids(self, "call_id", "rollout_id", "run_id", "gateway_id")
        _require(self.extends != self.call_id, self, "a call cannot extend itself")
        _require(self.request_head >= 0 and self.request_tail >= 0, self, "request_head and request_tail must be >= 0")
        _require(self.extends is not None or self.request_head == self.request_tail == 0, self,
                 "request_head and request_tail need extends")
        _require(self.seq >= 0, self, "seq must be >= 0")
        _require(self.choice_index >= 0, self, "choice_index must be >= 0")
        _require(self.weight_version >= 0, self, "weight_version must be >= 0")
        _require(self.status in CALL_STATUSES, self, _CALL_STATUS)
        if len(self.response_logprobs) != len(self.response_token_ids):
            _require(False, self, f"{len(self.response_logprobs)} logprobs for {len(self.response_token_ids)} "
                     "response tokens")


@dataclass(frozen=True, slots=True, kw_only=True)
class RolloutSealed:
    rollout_id: str
    run_id: str
    call_ids: list[str]
    sealed_at: datetime = field(default_factory=utcnow)

    @property
    def n_calls(self) -> int:
        return len(self.call_ids)

    def __post_init__(self) -> None:
        _require_ids(self, "rollout_id", "run_id")
        _require(len(set(self.call_ids)) == len(self.call_ids), self, "call_ids must be distinct")
        _require_aware(self, "sealed_at")


@dataclass(frozen=True, slots=True, kw_only=True)
class RolloutStarted:
    rollout_id: str
    run_id: str
    group_id: str
    task_id: str
    task_json: str
    group_size: int
    runner: str = "local"
    attempt: int = 0
    retry_of: str | None = None
    weight_version: int = 0
    #: a held-out validation rollout: scored per weight version, never trained on
    validation: bool = False
    #: the sampling temperature its token pins for every call; None: the harness's own
    temperature: float | None = None
    started_at: datetime = field(default_factory=utcnow)

    def __post_init__(self) -> None:
        _require_ids(self, "rollout_id", "run_id", "group_id", "task_id")
        _require(self.group_size >= 1, self, "group_size must be >= 1")
        _require(self.attempt >= 0, self, "attempt must be >= 0")
        _require(self.temperature is None or (math.isfinite(self.temperature) and self.temperature >= 0), self,
                 "temperature must be finite and >= 0")
        _require_aware(self, "started_at")


@dataclass(frozen=True, slots=True, kw_only=True)
class RewardReported:
    rollout_id: str
    run_id: str
    reward: float
    source: str
    details_json: str | None = None
    call_id: str | None = None  # set: the reward of that call alone (a step reward)
    reported_at: datetime = field(default_factory=utcnow)

    def __post_init__(self) -> None:
        _require_ids(self, "rollout_id", "run_id", "source")
        _require(math.isfinite(self.reward), self, "reward must be finite")
        _require_aware(self, "reported_at")


@dataclass(frozen=True, slots=True, kw_only=True)
class RolloutFinished:
    rollout_id: str
    run_id: str
    status: str
    duration_s: float
    exit_code: int | None = None
    reward: float | None = None
    reason: str | None = None
    finished_at: datetime = field(default_factory=utcnow)

    def __post_init__(self) -> None:
        _require_ids(self, "rollout_id", "run_id")
        _require(self.status in ROLLOUT_STATUSES, self, _ROLLOUT_STATUS)
        _require(self.duration_s >= 0, self, "duration_s must be >= 0")
        _require(self.reward is None or math.isfinite(self.reward), self, "reward must be finite")
        _require_aware(self, "finished_at")


@dataclass(frozen=True, slots=True, kw_only=True)
class CallSpan:
    """Where one call's response lies in a segment's tokens (end exclusive)."""

    seq: int
    start: int
    end: int


@dataclass(frozen=True, slots=True, kw_only=True)
class StepReward:
    seq: int
    reward: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Segment:
    token_ids: list[int]
    loss_mask: list[bool]
    logprobs: list[float]
    weight_versions: list[int]
    spans: list[CallSpan] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        _require(
            len(self.loss_mask) == len(self.logprobs) == len(self.weight_versions) == n,
            self,
            "token_ids, loss_mask, logprobs and weight_versions must have the same length",
        )
        _require(all(0 <= sp.start <= sp.end <= n for sp in self.spans), self, "spans must lie within token_ids")


@dataclass(frozen=True, slots=True, kw_only=True)
class RolloutSample:
    rollout_id: str
    reward: float
    status: str
    segments: list[Segment]
    filled: bool = False
    step_rewards: list[StepReward] = field(default_factory=list)

    def __post_init__(self) -> None:
        _require_ids(self, "rollout_id")
        _require(math.isfinite(self.reward), self, "reward must be finite")
        _require(self.status in ROLLOUT_STATUSES, self, _ROLLOUT_STATUS)


@dataclass(frozen=True, slots=True, kw_only=True)
class DroppedRollout:
    rollout_id: str
    status: str
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskGroup:
    group_id: str
    run_id: str
    task_id: str
    group_size: int
    rollouts: list[RolloutSample]
    partial: bool = False
    dropped: list[DroppedRollout] = field(default_factory=list)
    created_at: datetime = field(default_factory=utcnow)

    def __post_init__(self) -> None:
        _require_ids(self, "group_id", "run_id", "task_id")
        _require(self.group_size >= 1, self, "group_size must be >= 1")
        _require(
            len(self.rollouts) + len(self.dropped) <= self.group_size or self.partial,
            self,
            "more rollouts than group_size",
        )
        _require_aware(self, "created_at")


@dataclass(frozen=True, slots=True, kw_only=True)
class UpdateRequested:
    run_id: str
    version: int
    n_task_groups: int
    requested_at: datetime = field(default_factory=utcnow)

    def __post_init__(self) -> None:
        _require_ids(self, "run_id")
        _require(self.version >= 1, self, "version must be >= 1")
        _require_aware(self, "requested_at")


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewayDrained:
    run_id: str
    version: int
    gateway_id: str
    held_calls: int = 0
    drained_at: datetime = field(default_factory=utcnow)

    def __post_init__(self) -> None:
        _require_ids(self, "run_id", "gateway_id")
        _require_aware(self, "drained_at")


@dataclass(frozen=True, slots=True, kw_only=True)
class WeightVersionPublished:
    run_id: str
    version: int
    checkpoint_path: str | None = None
    final: bool = False  # the trainer's last update of the run
    published_at: datetime = field(default_factory=utcnow)

    def __post_init__(self) -> None:
        _require_ids(self, "run_id")
        _require(self.version >= 0, self, "version must be >= 0")
        _require_aware(self, "published_at")


@dataclass(frozen=True, slots=True, kw_only=True)
class UpdateAborted:
    run_id: str
    version: int
    reason: str
    aborted_at: datetime = field(default_factory=utcnow)

    def __post_init__(self) -> None:
        _require_ids(self, "run_id")
        _require_aware(self, "aborted_at")


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewayJoined:
    run_id: str
    gateway_id: str
    url: str
    joined_at: datetime = field(default_factory=utcnow)

    def __post_init__(self) -> None:
        _require_ids(self, "run_id", "gateway_id")
        _require_aware(self, "joined_at")


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewayLeft:
    run_id: str
    gateway_id: str
    reason: str
    left_at: datetime = field(default_factory=utcnow)

    def __post_init__(self) -> None:
        _require_ids(self, "run_id", "gateway_id")
        _require_aware(self, "left_at")


@dataclass(frozen=True, slots=True, kw_only=True)
class ValidationStarted:
    """The held-out rollouts of `version` are out: the trainer waits for their report before its next update."""
    run_id: str
    version: int
    rollouts: int
    started_at: datetime = field(default_factory=utcnow)

    def __post_init__(self) -> None:
        _require_ids(self, "run_id")
        _require(self.version >= 0, self, "version must be >= 0")
        _require(self.rollouts >= 0, self, "rollouts must be >= 0")
        _require_aware(self, "started_at")


@dataclass(frozen=True, slots=True, kw_only=True)
class ValidationScore:
    """One sampling setting's score on the held-out tasks."""
    setting: str
    rollouts: int
    mean_reward: float
    temperature: float | None = None
    unrewarded: int = 0
    duration_s: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ValidationReported:
    run_id: str
    version: int
    scores: list[ValidationScore]
    seconds: float = 0.0
    reported_at: datetime = field(default_factory=utcnow)

    def __post_init__(self) -> None:
        _require_ids(self, "run_id")
        _require(self.version >= 0, self, "version must be >= 0")
        _require(all(math.isfinite(s.mean_reward) for s in self.scores), self, "mean_reward must be finite")
        _require_aware(self, "reported_at")


@dataclass(frozen=True, slots=True, kw_only=True)
class CallAdvantage:
    seq: int
    advantage: float


@dataclass(frozen=True, slots=True, kw_only=True)
class RolloutAdvantage:
    """What the trainer gave one rollout: the page shows it beside the reward, as it was, not recomputed."""
    group_id: str
    rollout_id: str
    advantage: float
    calls: list[CallAdvantage] = field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainerStep:
    run_id: str
    version: int
    task_groups: int
    tokens: int
    mean_reward: float
    loss: float
    entropy: float
    clip_fraction: float
    kl: float
    grad_norm: float
    staleness_mean: float
    staleness_max: float
    dropped_stale: int = 0
    dropped_no_signal: int = 0
    seconds: float = 0.0
    advantages: list[RolloutAdvantage] = field(default_factory=list)
    stepped_at: datetime = field(default_factory=utcnow)

    def __post_init__(self) -> None:
        _require_ids(self, "run_id")
        _require(self.version >= 1, self, "version must be >= 1")
        _require_aware(self, "stepped_at")


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadLetter:
    topic: str
    partition: int
    offset: int
    reason: str
    error_type: str
    consumer: str
    key: bytes | None = None
    value: bytes | None = None
    dead_at: datetime = field(default_factory=utcnow)


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
