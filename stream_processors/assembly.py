"""A rollout's calls → training segments (docs/architecture.md, "Sample assembly"). Pure.

Calls are taken in (seq, choice) order. A call joins the current segment when
its prompt starts with the segment so far: the appended gap (tool output,
user turns, the template's glue) is masked out, the response is trainable
with its behaviour logprobs, and its span (where its response lies) is kept
for credit per call. Otherwise the call starts a new segment, so a harness
that compacts its context yields several segments, and the other choices of
an n>1 call each get their own.

A call recorded against the one that ends the segment (`extends`, since v5)
carries exactly the gap, so the common case costs the size of the call, not of
the prompt. Any other call that extends one is first made whole from its chain.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from schemas.events import CallSpan, Segment


@dataclass(frozen=True, slots=True)
class Call:
    call_id: str
    seq: int
    choice_index: int
    prompt_token_ids: Sequence[int]  # with `extends`, only the tokens after its prompt and response
    response_token_ids: Sequence[int]
    response_logprobs: Sequence[float]
    weight_version: int
    ok: bool = True
    extends: str | None = None


def unresolved(calls: Sequence[Call]) -> str | None:
    """Why these calls' prompts cannot be rebuilt (a call extends one that is not among them, or calls extend
    each other in a loop), or None if they can."""
    by_id = {c.call_id: c for c in calls}
    for call in calls:
        seen = {call.call_id}
        current = call
        while current.extends is not None:
            base = by_id.get(current.extends)
            if base is None:
                return f"call {current.call_id} extends call {current.extends}, which the seal does not list"
            if base.call_id in seen:
                return f"calls {sorted(seen)} extend each other in a loop"
            seen.add(base.call_id)
            current = base
    return None


def whole_prompt(call: Call, by_id: dict[str, Call]) -> list[int]:
    """The call's whole prompt, from the calls it extends (`unresolved` says they are all there)."""
    parts = [call.prompt_token_ids]
    while call.extends is not None:
        call = by_id[call.extends]
        parts += [call.response_token_ids, call.prompt_token_ids]
    out: list[int] = []
    for part in reversed(parts):
        out.extend(part)
    return out


def assemble(calls: Sequence[Call]) -> list[Segment]:
    by_id = {c.call_id: c for c in calls}
    built: list[tuple[list[int], list[bool], list[float], list[int], list[CallSpan]]] = []
    last = ""  # the call whose response ends the last segment
    for call in sorted(calls, key=lambda c: (c.seq, c.choice_index, c.call_id)):
        if not call.ok or not call.response_token_ids:
            continue  # nothing was generated: nothing to learn from
        response, v = call.response_token_ids, call.weight_version
        if built and call.extends is not None and call.extends == last:
            tokens, mask, logprobs, versions, spans = built[-1]
            gap: Sequence[int] = call.prompt_token_ids  # the segment so far is exactly what it extends
        else:
            prompt = whole_prompt(call, by_id) if call.extends is not None else list(call.prompt_token_ids)
            if built and prompt[:len(built[-1][0])] == built[-1][0]:
                tokens, mask, logprobs, versions, spans = built[-1]
                gap = prompt[len(tokens):]
            else:
                tokens, mask, logprobs, versions, spans = [], [], [], [], []
                built.append((tokens, mask, logprobs, versions, spans))
                gap = prompt
        tokens.extend(gap)
        spans.append(CallSpan(seq=call.seq, start=len(tokens), end=len(tokens) + len(response)))
        tokens.extend(response)
        mask += [False] * len(gap) + [True] * len(response)
        logprobs += [0.0] * len(gap)
        logprobs.extend(call.response_logprobs)
        versions += [v] * (len(gap) + len(response))
        last = call.call_id
    return [Segment(token_ids=t, loss_mask=m, logprobs=lp, weight_versions=w, spans=sp) for t, m, lp, w, sp in built]
