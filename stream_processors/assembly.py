"""A rollout's calls → training segments (docs/architecture.md, "Sample assembly"). Pure.

Calls are taken in (seq, choice) order. A call joins the current segment when
its prompt starts with the segment so far: the appended gap (tool output,
user turns, the template's glue) is masked out, the response is trainable
with its behaviour logprobs, and its span (where its response lies) is kept
for credit per call. Otherwise the call starts a new segment, so a harness
that compacts its context yields several segments, and the other choices of
an n>1 call each get their own.
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas.events import CallSpan, Segment


@dataclass(frozen=True)
class Call:
    call_id: str
    seq: int
    choice_index: int
    prompt_token_ids: list[int]
    response_token_ids: list[int]
    response_logprobs: list[float]
    weight_version: int
    ok: bool = True


def assemble(calls: list[Call]) -> list[Segment]:
    built: list[tuple[list[int], list[bool], list[float], list[int], list[CallSpan]]] = []
    for call in sorted(calls, key=lambda c: (c.seq, c.choice_index, c.call_id)):
        if not call.ok or not call.response_token_ids:
            continue  # nothing was generated: nothing to learn from
        prompt, response, v = call.prompt_token_ids, call.response_token_ids, call.weight_version
        if built and prompt[:len(built[-1][0])] == built[-1][0]:
            tokens, mask, logprobs, versions, spans = built[-1]
            gap = prompt[len(tokens):]
        else:
            tokens, mask, logprobs, versions, spans = [], [], [], [], []
            built.append((tokens, mask, logprobs, versions, spans))
            gap = prompt
        tokens += gap
        spans.append(CallSpan(seq=call.seq, start=len(tokens), end=len(tokens) + len(response)))
        tokens += response
        mask += [False] * len(gap) + [True] * len(response)
        logprobs += [0.0] * len(gap) + list(call.response_logprobs)
        versions += [v] * (len(gap) + len(response))
    return [Segment(token_ids=t, loss_mask=m, logprobs=lp, weight_versions=w, spans=sp) for t, m, lp, w, sp in built]
