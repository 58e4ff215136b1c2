"""The gateway's one internal shape of a chat call, whichever API the harness speaks.

OpenAI chat completions and Anthropic messages both become a `ChatRequest`;
every generation comes back as `Generation`s (and the call's `TokenUsage`)
that each protocol module turns into its own response; a call reports its
progress to the answer writers as `Started` and `Finished` (a stream's text
in between is `choices.Delta`). `message_key` is how an assistant message a
harness sends back is recognised as one the model produced.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from schemas.seeds import seeded_name


class ToolCall(NamedTuple):
    id: str
    name: str
    arguments: str  # JSON text, as OpenAI carries it


class Message(NamedTuple):
    """Tuples, not dataclasses: a rollout's next call is checked to begin with the previous call's messages, and
    tuples compare in C (a 128k-token conversation's messages in microseconds rather than a tenth of a
    millisecond)."""

    role: str  # system, user, assistant or tool
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None

    def for_template(self) -> dict[str, Any]:
        """The message as Hugging Face chat templates expect it (OpenAI's shape)."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in self.tool_calls
            ]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


def unanswered_result(messages: tuple[Message, ...] | list[Message]) -> tuple[int, str] | None:
    """The first tool result (its index and call id) that answers no tool call of an earlier assistant turn.

    Every API refuses one (OpenAI's chat and Responses, Anthropic's messages): a result for a call the model never
    made is a conversation the model did not have, and training on it would teach from a forged history."""
    made: set[str] = set()
    for index, m in enumerate(messages):
        if m.role == "assistant":
            made.update(c.id for c in m.tool_calls)
        elif m.role == "tool" and m.tool_call_id not in made:
            return index, m.tool_call_id or ""
    return None


#: Bounds of what a call's record can hold (Avro int and long): a larger value is refused as the request is
#: read, rather than failing to be recorded after the engine has done the work.
MAX_TOKENS = 2**31 - 1
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1


@dataclass(frozen=True)
class SamplingRequest:
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    n: int = 1
    top_logprobs: int = 0


@dataclass(frozen=True)
class ChatRequest:
    messages: tuple[Message, ...]
    tools: tuple[dict[str, Any], ...] = ()  # OpenAI function tools: {"type": "function", "function": {...}}
    tool_choice: str = "auto"  # auto, none or required
    sampling: SamplingRequest = field(default_factory=SamplingRequest)
    raw_prompt: str | None = None  # plain completions: the prompt text, no chat template

    def pinned(self, temperature: float | None) -> ChatRequest:
        """The request with the temperature the rollout's token pins (validation: greedy), whatever was asked."""
        if temperature is None or temperature == self.sampling.temperature:
            return self
        return replace(self, sampling=replace(self.sampling, temperature=temperature))


@dataclass(kw_only=True)
class Generation:
    """One choice: the model's tokens and what the tool-call parser made of its text."""

    index: int
    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text: str
    finish_reason: str  # stop, length or tool_calls
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    stop_reason: str | int | None = None  # the stop string (or token id) that ended it, as the engine says

    @classmethod
    def failed(cls) -> Generation:
        """The empty choice a failed call is recorded with."""
        return cls(index=0, token_ids=[], logprobs=[], top_logprobs=[], text="", finish_reason="error")


@dataclass(frozen=True, kw_only=True)
class TokenUsage:
    """Counted once per call; each protocol only renames the fields."""

    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass
class Started:
    """The prompt is rendered and the call admitted: what a stream can announce before any token."""

    prompt_tokens: int
    call_id: str = ""  # what the harness names the call by (a step reward): the gateway's id of it


@dataclass(kw_only=True)
class Finished:
    """The call is recorded: what the harness's answer (or a stream's last events) is made of."""

    generations: list[Generation]
    usage: TokenUsage
    weight_version: int
    body: bytes  # the response as JSON, as recorded
    call_id: str = ""


def seeded_tool_calls(generation: Generation, seed: int, seq: int) -> Generation:
    """The generation with tool-call ids drawn from the call's seed and number instead of at random.

    A harness sends the ids back with the results, so random ones alone would make two runs of one seeded rollout
    send different requests from the first tool call on; these are the same in both, and still unique within a
    conversation (the call's number and the choice and place of the call are in them)."""
    if not generation.tool_calls:
        return generation
    calls = [ToolCall(f"call_{seeded_name(seed, seq, 'tool', generation.index, k)[:24]}", c.name, c.arguments)
             for k, c in enumerate(generation.tool_calls)]
    return replace(generation, tool_calls=calls)


def message_key(content: str, tool_calls: tuple[ToolCall, ...] | list[ToolCall]) -> str:
    """Identity of an assistant message, blind to JSON spacing and tool call ids (harnesses rewrite both): a
    digest, short enough to record with every call (`ModelCall.turn_key`) and to keep per turn in memory."""
    calls = [[call.name, _arguments(call.arguments)] for call in tool_calls]
    try:
        canonical = json.dumps([content or "", calls], sort_keys=True, separators=(",", ":"))
    except RecursionError:  # read back at a shallower depth than it can be written at here: keep the text
        canonical = json.dumps([content or "", [[c.name, c.arguments] for c in tool_calls]], separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


def _arguments(text: str) -> Any:
    """Tool-call arguments parsed, so that spacing does not count; the text itself when it is not JSON a
    harness could mean (malformed, nested past the recursion limit, or an integer of over 4300 digits)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # JSONDecodeError is a ValueError
        return text
