"""Which earlier call of its rollout a new prompt extends, so that its record holds only the difference.

A harness sends its whole conversation every call; the gateway renders it with
the model's own turns reused token for token, so a prompt that continues an
earlier call begins with exactly that call's prompt and response. The gateway
keeps a digest of those tokens for the rollout's latest acknowledged calls
(`Tip`); a new prompt that starts with one of them is recorded against the
longest (`schemas.calls` says how, and rebuilds it). Only acknowledged calls
are tips: one the log does not hold can never be extended.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Iterable
from dataclasses import dataclass

from schemas.calls import split_request


@dataclass(frozen=True, slots=True)
class Tip:
    call_id: str
    length: int  # tokens of its prompt and response
    digest: bytes  # of those tokens, packed
    request: str  # its whole request, which the next call's request is recorded against


@dataclass(frozen=True, slots=True)
class Extension:
    """How a call is recorded: the call it extends, the tokens after that call's, and the request's difference."""

    extends: str | None
    prompt: list[int]
    request_head: int
    request_tail: int
    request: str


def _digest(packed: bytes | memoryview) -> bytes:
    return hashlib.blake2b(packed, digest_size=16).digest()


def packed(tokens: list[int]) -> memoryview:
    """Token ids as int32 bytes, what digests are of; a call packs its prompt once for `extension` and `tip`."""
    return memoryview(array("i", tokens)).cast("B")


def tip(call_id: str, prompt: list[int] | memoryview, response: list[int], request: str) -> Tip:
    """`prompt`: its ids, or `packed`."""
    prompt = prompt if isinstance(prompt, memoryview) else packed(prompt)
    digest = hashlib.blake2b(prompt, digest_size=16)
    digest.update(array("i", response))
    return Tip(call_id, len(prompt) // 4 + len(response), digest.digest(), request)


def extension(tips: Iterable[Tip], prompt: list[int], request: str, packed_prompt: memoryview | None = None
              ) -> Extension:
    """The call recorded against the longest tip its prompt starts with; whole if it starts with none.
    `packed_prompt`: `packed(prompt)`, where the caller has it."""
    packed_ = packed_prompt
    for t in sorted(tips, key=lambda t: -t.length):
        if t.length > len(prompt) or t.length == 0:
            continue
        packed_ = packed_ if packed_ is not None else packed(prompt)
        if _digest(packed_[:t.length * 4]) == t.digest:
            head, tail, middle = split_request(t.request, request)
            return Extension(t.call_id, prompt[t.length:], head, tail, middle)
    return Extension(None, prompt, 0, 0, request)
