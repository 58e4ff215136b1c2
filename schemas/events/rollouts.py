"""A rollout's life as the gateway and the runners record it: started, its model calls, sealed, rewarded, finished."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime

from schemas.events._checks import (
    CALL_STATUS_RULE,
    CALL_STATUSES,
    ROLLOUT_STATUS_RULE,
    ROLLOUT_STATUSES,
    require,
    require_aware,
    require_ids,
    utcnow,
)
from schemas.seeds import MAX_SEED


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
        require_aware(self, "received_at", "finished_at")


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
        require_ids(self, "call_id", "rollout_id", "run_id", "gateway_id")
        require(self.extends != self.call_id, self, "a call cannot extend itself")
        require(self.request_head >= 0 and self.request_tail >= 0, self, "request_head and request_tail must be >= 0")
        require(self.extends is not None or self.request_head == self.request_tail == 0, self,
                 "request_head and request_tail need extends")
        require(self.seq >= 0, self, "seq must be >= 0")
        require(self.choice_index >= 0, self, "choice_index must be >= 0")
        require(self.weight_version >= 0, self, "weight_version must be >= 0")
        require(self.status in CALL_STATUSES, self, CALL_STATUS_RULE)
        if len(self.response_logprobs) != len(self.response_token_ids):
            require(False, self, f"{len(self.response_logprobs)} logprobs for {len(self.response_token_ids)} "
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
        require_ids(self, "rollout_id", "run_id")
        require(len(set(self.call_ids)) == len(self.call_ids), self, "call_ids must be distinct")
        require_aware(self, "sealed_at")


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
    #: the rollout's seed (`schemas.seeds`): the harness's TETHER_SEED, and where unseeded calls' seeds come from
    seed: int | None = None
    started_at: datetime = field(default_factory=utcnow)

    def __post_init__(self) -> None:
        require_ids(self, "rollout_id", "run_id", "group_id", "task_id")
        require(self.seed is None or 0 <= self.seed <= MAX_SEED, self, f"seed must be from 0 to {MAX_SEED}")
        require(self.group_size >= 1, self, "group_size must be >= 1")
        require(self.attempt >= 0, self, "attempt must be >= 0")
        require(self.temperature is None or (math.isfinite(self.temperature) and self.temperature >= 0), self,
                 "temperature must be finite and >= 0")
        require_aware(self, "started_at")


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
        require_ids(self, "rollout_id", "run_id", "source")
        require(math.isfinite(self.reward), self, "reward must be finite")
        require_aware(self, "reported_at")


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
        require_ids(self, "rollout_id", "run_id")
        require(self.status in ROLLOUT_STATUSES, self, ROLLOUT_STATUS_RULE)
        require(self.duration_s >= 0, self, "duration_s must be >= 0")
        require(self.reward is None or math.isfinite(self.reward), self, "reward must be finite")
        require_aware(self, "finished_at")
