"""Which earlier call of its rollout a new prompt extends, so that its record holds only the difference.

A harness sends its whole conversation every call; the gateway renders it with
the model's own turns reused token for token, so a prompt that continues an
earlier call begins with exactly that call's prompt and response. The gateway
keeps those tokens, packed, for the rollout's latest acknowledged calls
(`Tip`); a new prompt that starts with one of them is recorded against the
longest (`schemas.calls` says how, and rebuilds it). Only acknowledged calls
are tips: one the log does not hold can never be extended. Packed tokens are
compared with memcmp rather than hashed: a 128k-token prompt compares in tens
of microseconds, where a digest of it took most of a millisecond, and a tip
shares its prompt's bytes with the rendering (`Rendered.packed`).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from dataclasses import dataclass

from schemas.calls import split_request


@dataclass(frozen=True, slots=True)
class Tip:
    call_id: str
    prompt: bytes  # its prompt's ids, packed (`packed`)
    response: bytes  # its response's, the same
    request: str  # its whole request, which the next call's request is recorded against

    @property
    def length(self) -> int:
        """Tokens of its prompt and response."""
        return (len(self.prompt) + len(self.response)) // 4

    def begins(self, prompt: bytes) -> bool:
        """Whether the packed `prompt` starts with this call's prompt and response."""
        return prompt.startswith(self.prompt) and prompt.startswith(self.response, len(self.prompt))  # no copies


@dataclass(frozen=True, slots=True)
class Extension:
    """How a call is recorded: the call it extends, the tokens after that call's, and the request's difference."""

    extends: str | None
    prompt: list[int]
    request_head: int
    request_tail: int
    request: str


def packed(tokens: list[int]) -> bytes:
    """Token ids as int32 bytes, what tips compare; a call packs its prompt once for `extension` and `tip`."""
    return array("i", tokens).tobytes()


def tip(call_id: str, prompt: list[int] | bytes, response: list[int], request: str) -> Tip:
    """`prompt`: its ids, or `packed` (then shared, not copied)."""
    return Tip(call_id, prompt if isinstance(prompt, bytes) else packed(prompt), packed(response), request)


def extension(tips: Iterable[Tip], prompt: list[int], request: str, packed_prompt: bytes | None = None
              ) -> Extension:
    """The call recorded against the longest tip its prompt starts with; whole if it starts with none.
    `packed_prompt`: `packed(prompt)`, where the caller has it."""
    packed_ = packed_prompt
    for t in sorted(tips, key=lambda t: -t.length):
        if t.length > len(prompt) or t.length == 0:
            continue
        packed_ = packed_ if packed_ is not None else packed(prompt)
        if t.begins(packed_):
            head, tail, middle = split_request(t.request, request)
            return Extension(t.call_id, prompt[t.length:], head, tail, middle)
    return Extension(None, prompt, 0, 0, request)
