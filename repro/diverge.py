"""Two runs of the same tasks, paired rollout by rollout and compared call by call.

Rollouts pair by their group (the task, and the validation round and setting
for held-out ones) and their seed (the slot where a run has no seeds); the
latest attempt of each stands for it. Two calls are the same when the
harness's requests are equal (as JSON, key order aside) and the engine's
tokens are equal. The first call where a pair differs says who diverged
first, since every earlier response was equal: where the request differs the
**harness** did (its own clock, ids, paths or choices), where the same
request got other tokens the **engine** did; a rollout that stops or goes on
where the other does not is the harness's too. Pure: events in, a
`Comparison` out (`repro.report` shows it).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol

from repro.spans import Span, changed_spans, readable_diff
from schemas.events import ModelCall, RolloutStarted
from schemas.rollout_ids import place, within_run

Side = Literal["harness", "engine"]


@dataclass(frozen=True, slots=True)
class Call:
    seq: int
    request: str  # canonical JSON (sorted keys): what equality compares
    request_text: str  # one line per message, for the diff
    response: tuple[int, ...]  # the engine's tokens
    response_text: str
    logprobs: tuple[float, ...] = ()  # the engine's, of those tokens
    prompt: tuple[int, ...] | None = None  # the prompt's token ids as the engine got them, where known


@dataclass(frozen=True, slots=True)
class Rollout:
    rollout_id: str
    key: tuple[str, str]  # (its group within the run, its seed or slot): what pairs it with the other run's
    task_id: str
    seed: int | None
    calls: tuple[Call, ...]


@dataclass(frozen=True, slots=True)
class Divergence:
    task_id: str
    seed: int | None
    a: str  # rollout ids
    b: str
    call: int  # the index of the first call that differs
    side: Side
    why: str
    diff: list[str]
    spans: list[Span]


@dataclass
class Comparison:
    run_a: str
    run_b: str
    pairs: int = 0
    identical_rollouts: int = 0
    calls: int = 0  # call positions compared: per pair, the longer rollout's calls
    identical_calls: int = 0  # the same request and the same tokens
    #: the same prompt and answer token ids, the requests equal or not (what trains); None where prompts are unknown
    same_tokens_calls: int | None = 0
    exact_calls: int = 0  # identical, and their logprobs the same to the bit (what the trainer learns from)
    max_logprob_drift: float = 0.0  # the largest |difference| of a token's logprob among identical calls
    only_a: list[str] = field(default_factory=list)  # rollouts without a partner
    only_b: list[str] = field(default_factory=list)
    divergences: list[Divergence] = field(default_factory=list)
    #: each run's training data hash (`stream_processors.pipeline.training_hash`), where the caller rebuilt it
    training: tuple[str, str] | None = None

    def sides(self) -> Counter[str]:
        return Counter(d.side for d in self.divergences)

    def first_calls(self) -> Counter[int]:
        """How many pairs diverged first at each call index."""
        return Counter(d.call for d in self.divergences)

    def span_classes(self) -> Counter[str]:
        """Divergences per class of the spans that differ (a divergence counts once per class it shows)."""
        return Counter(kind for d in self.divergences for kind in {s.kind for s in d.spans})

    def to_json(self) -> dict[str, Any]:
        return {
            "run_a": self.run_a, "run_b": self.run_b, "pairs": self.pairs,
            "identical_rollouts": self.identical_rollouts,
            "identical_rollouts_share": self.identical_rollouts / self.pairs if self.pairs else None,
            "calls": self.calls, "identical_calls": self.identical_calls,
            "identical_calls_share": self.identical_calls / self.calls if self.calls else None,
            "same_tokens_calls": self.same_tokens_calls,
            "exact_calls": self.exact_calls, "max_logprob_drift": self.max_logprob_drift,
            "first_diverged": dict(self.sides()), "first_call": {str(k): v for k, v in
                                                                  sorted(self.first_calls().items())},
            "span_classes": dict(self.span_classes().most_common()),
            "only_a": self.only_a, "only_b": self.only_b,
            "training_hashes": list(self.training) if self.training else None,
            "training_equal": self.training[0] == self.training[1] if self.training else None,
            "divergences": [asdict(d) for d in self.divergences],
        }


class Started(Protocol):
    """What pairing needs of a rollout's start: `RolloutStarted`, or a row of the analytics `rollouts` table."""

    @property
    def rollout_id(self) -> str: ...
    @property
    def group_id(self) -> str: ...
    @property
    def task_id(self) -> str: ...
    @property
    def attempt(self) -> int: ...
    @property
    def seed(self) -> int | None: ...


def rollouts(events: Iterable[object], run_id: str) -> dict[tuple[str, str], Rollout]:
    """The run's rollouts by pairing key (its latest attempt per key), each with its calls in order. `events`: the
    run's RolloutStarted and whole ModelCalls (`schemas.calls.whole`)."""
    started: list[RolloutStarted] = []
    calls: dict[str, list[Call]] = {}
    for event in events:
        if isinstance(event, RolloutStarted):
            started.append(event)
        elif isinstance(event, ModelCall) and event.choice_index == 0:
            calls.setdefault(event.rollout_id, []).append(call_of(
                event.seq, event.request_json, event.response_json, event.response_token_ids,
                event.response_logprobs, event.prompt_token_ids))
    return keyed(started, calls, run_id)


def keyed(started: Iterable[Started], calls: Mapping[str, list[Call]], run_id: str
          ) -> dict[tuple[str, str], Rollout]:
    """Rollouts by pairing key, the latest attempt of each key standing for it; `calls`: each rollout's first
    choices, whole, in any order."""
    latest: dict[tuple[str, str], tuple[int, Started]] = {}
    for s in started:
        found = place(s.rollout_id)
        slot, attempt = (str(found.slot), found.attempt) if found else (s.rollout_id, s.attempt)
        group = within_run(s.group_id, run_id)
        key = (group, f"seed {s.seed}" if s.seed is not None else f"slot {slot}")
        if key not in latest or attempt > latest[key][0]:
            latest[key] = (attempt, s)
    return {key: Rollout(s.rollout_id, key, s.task_id, s.seed,
                         tuple(sorted(calls.get(s.rollout_id, []), key=lambda c: c.seq)))
            for key, (_, s) in latest.items()}


def compare(run_a: str, a: dict[tuple[str, str], Rollout], run_b: str, b: dict[tuple[str, str], Rollout]
            ) -> Comparison:
    out = Comparison(run_a, run_b, only_a=sorted(a[k].rollout_id for k in a.keys() - b.keys()),
                     only_b=sorted(b[k].rollout_id for k in b.keys() - a.keys()))
    for key in sorted(a.keys() & b.keys()):
        left, right = a[key], b[key]
        out.pairs += 1
        out.calls += max(len(left.calls), len(right.calls))
        for x, y in zip(left.calls, right.calls, strict=False):
            if x.prompt is None or y.prompt is None:
                out.same_tokens_calls = None
            elif out.same_tokens_calls is not None:
                out.same_tokens_calls += x.prompt == y.prompt and x.response == y.response
            if x.request == y.request and x.response == y.response:
                out.identical_calls += 1
                out.exact_calls += x.logprobs == y.logprobs
                out.max_logprob_drift = max([out.max_logprob_drift, *(
                    abs(p - q) for p, q in zip(x.logprobs, y.logprobs, strict=False))])
        divergence = first_divergence(left, right)
        if divergence is None:
            out.identical_rollouts += 1
        else:
            out.divergences.append(divergence)
    return out


def first_divergence(a: Rollout, b: Rollout) -> Divergence | None:
    """Where the pair first differs, and which side moved first; None when every call is the same."""
    def diverged(i: int, side: Side, why: str, old: str, new: str) -> Divergence:
        return Divergence(a.task_id, a.seed, a.rollout_id, b.rollout_id, i, side, why,
                          readable_diff(old, new, (a.rollout_id, b.rollout_id)), changed_spans(old, new))

    for i, (x, y) in enumerate(zip(a.calls, b.calls, strict=False)):
        if x.request != y.request:
            return diverged(i, "harness", "the requests differ", x.request_text, y.request_text)
        if x.response != y.response:
            return diverged(i, "engine", "the same request got other tokens", x.response_text, y.response_text)
    if len(a.calls) != len(b.calls):
        i = min(len(a.calls), len(b.calls))
        return Divergence(a.task_id, a.seed, a.rollout_id, b.rollout_id, i, "harness",
                          f"one rollout made {len(a.calls)} calls, the other {len(b.calls)}", [], [])
    return None


def call_of(seq: int, request_json: str, response_json: str, token_ids: Sequence[int],
            logprobs: Sequence[float], prompt: Sequence[int] | None = None) -> Call:
    """One recorded call (made whole) as it is compared."""
    try:
        request = json.loads(request_json)
    except ValueError:  # recorded as sent; a body that is not JSON was refused, but compare it all the same
        request = request_json
    try:
        response = json.loads(response_json)
    except ValueError:
        response = response_json
    return Call(seq, json.dumps(request, sort_keys=True), _request_text(request), tuple(token_ids),
                _response_text(response), tuple(logprobs), tuple(prompt) if prompt is not None else None)


def _request_text(request: Any) -> str:
    """One line per message (OpenAI's messages, Anthropic's, Responses' input), then the rest of the request."""
    if not isinstance(request, dict):
        return str(request)
    messages = request.get("messages", request.get("input"))
    lines = []
    if isinstance(messages, list):
        for m in messages:
            if isinstance(m, dict):
                rest = {k: v for k, v in m.items() if k not in ("role", "content")}
                content = m.get("content")
                text = content if isinstance(content, str) else json.dumps(content, sort_keys=True)
                lines.append(f"[{m.get('role', m.get('type', '?'))}] {text}"
                             + (f" {json.dumps(rest, sort_keys=True)}" if rest else ""))
            else:
                lines.append(json.dumps(m, sort_keys=True))
    elif isinstance(messages, str):
        lines.append(f"[input] {messages}")
    others = {k: v for k, v in request.items() if k not in ("messages", "input")}
    return "\n".join([*lines, f"[request] {json.dumps(others, sort_keys=True)}"])


def _response_text(response: Any) -> str:
    """The answer's message (OpenAI's first choice, Anthropic's content, Responses' output), ids and usage left out:
    they differ on every call and are the gateway's, not the model's."""
    if not isinstance(response, dict):
        return str(response)
    choices = response.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        message = choices[0].get("message", choices[0].get("text"))
        return message if isinstance(message, str) else json.dumps(message, sort_keys=True, indent=1)
    for key in ("content", "output"):
        if key in response:
            return json.dumps(response[key], sort_keys=True, indent=1)
    return json.dumps({k: v for k, v in response.items() if k not in ("id", "created", "usage")}, sort_keys=True)
