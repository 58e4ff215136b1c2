"""Calls that extend an earlier call, recorded as the difference, and made whole again. Pure.

An agent's prompt grows call by call: each is the previous prompt, the
previous answer and what the harness adds (a tool's output, a user turn). Whole,
an episode of n calls puts O(n²) tokens on tether.calls. Since v5 the gateway
records such a call with `extends` (the earlier call whose prompt and response
its prompt begins with) and only the tokens after them, and its request as the
part between the extended request's first `request_head` and last
`request_tail` characters. `Wholes` rebuilds prompts and requests in log order,
where an extended call always comes first: the gateway extends only calls Kafka
has acknowledged, and a rollout's calls share one partition.
"""

from __future__ import annotations

import dataclasses
from array import array
from collections.abc import Iterable

from schemas.errors import BusError
from schemas.events import ModelCall

_CHUNK = 4096


class MissingCall(BusError, KeyError):
    """A call extends one that is not known (never recorded, or not read): its prompt cannot be rebuilt."""


def split_request(base: str, request: str) -> tuple[int, int, str]:
    """(head, tail, middle): `request` as `base[:head] + middle + base[len(base) - tail:]`, with the longest
    head, then the longest tail that does not overlap it in either text."""
    head = _common(base, request, 0, min(len(base), len(request)), forward=True)
    limit = min(len(base), len(request)) - head
    tail = _common(base, request, 0, limit, forward=False)
    return head, tail, request[head:len(request) - tail]


def join_request(base: str, head: int, tail: int, middle: str) -> str:
    if head + tail > len(base):
        raise ValueError(f"head {head} and tail {tail} overlap in a request of {len(base)} characters")
    return base[:head] + middle + base[len(base) - tail:]


def _common(a: str, b: str, lo: int, hi: int, *, forward: bool) -> int:
    """Length of the longest common start (or end) of `a` and `b`, at most `hi`, given that the first `lo`
    characters are common: blocks that double while they match, then the differing block by halves. Every
    comparison is a memcmp of one block, so a request of n characters costs O(n) copied and compared in C, in
    O(log n) steps of Python."""

    def same(start: int, end: int) -> bool:  # characters start..end from the front (or from the back)
        # one slice copied, not two: `a` compared where it lies (end is at most the shorter text's length)
        if forward:
            return a.startswith(b[start:end], start)
        return a.endswith(b[len(b) - end:len(b) - start], 0, len(a) - start)

    step = _CHUNK
    while lo + step <= hi and same(lo, lo + step):
        lo += step
        step *= 2
    hi = min(hi, lo + step)
    while lo < hi:  # lo characters are common; find how many of the next hi - lo are
        mid = (lo + hi + 1) // 2
        if same(lo, mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclasses.dataclass(frozen=True, slots=True)
class Whole:
    """What a call that extends this one builds on: its whole prompt and response, and its whole request."""

    tokens: array[int]  # prompt + response, int32
    request: str


class Wholes:
    """The calls seen so far, whole; `add` them in log order. Holds O(n²) tokens for an episode of n calls: for
    readers that want every call as the harness made it (tools, tests), not for the stream processors."""

    def __init__(self) -> None:
        self._known: dict[str, Whole] = {}

    def add(self, call: ModelCall) -> ModelCall:
        """The call with its whole prompt and request (`extends` cleared); MissingCall if it extends an unknown one."""
        if call.extends is None:
            prompt, request = call.prompt_token_ids, call.request_json
        else:
            base = self._known.get(call.extends)
            if base is None:
                raise MissingCall(f"call {call.call_id} extends {call.extends}, which is not known")
            prompt = base.tokens.tolist() + call.prompt_token_ids
            request = join_request(base.request, call.request_head, call.request_tail, call.request_json)
        self._known[call.call_id] = Whole(array("i", prompt + call.response_token_ids), request)
        if call.extends is None:
            return call
        return dataclasses.replace(call, prompt_token_ids=prompt, request_json=request, extends=None,
                                   request_head=0, request_tail=0)

    def get(self, call_id: str) -> Whole | None:
        return self._known.get(call_id)


def whole(calls: Iterable[ModelCall]) -> list[ModelCall]:
    """Calls in log order, each made whole."""
    wholes = Wholes()
    return [wholes.add(c) for c in calls]
