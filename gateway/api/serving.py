"""What every API a harness speaks shares: a parsed request becomes a `Call` through `Gateway`, and its answer a
whole body or an event stream written by the API's own `Responder`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel

from gateway.chat import ChatRequest, Finished, Generation, Started, TokenUsage
from gateway.choices import Delta
from gateway.service import Call, Gateway
from schemas.rollout_token import Claims


class HarnessRequest(Protocol):
    stream: bool

    def to_chat(self) -> ChatRequest: ...


class Responder(Protocol):
    """How one protocol shows a call's result: a whole body, or its event stream."""

    def body(self, generations: list[Generation], usage: TokenUsage, version: int) -> BaseModel: ...

    def sse(self, items: AsyncIterator[Started | Delta | Finished]) -> AsyncIterator[str]: ...

    def rename(self, name: str) -> str:
        """Take ids from `name` (64 hex digits) instead of random ones; the answer's id."""
        ...


async def serve(gateway: Gateway, rollout: Claims, api: str, raw: str, parsed: HarnessRequest,
                answer: Responder, chat: ChatRequest | None = None, keep_as: str | None = None) -> Response:
    call = Call(rollout_id=rollout.rollout_id, api=api, request_json=raw,
                chat=(chat or parsed.to_chat()).pinned(rollout.temperature), respond=answer.body,
                issued_at=rollout.issued_at, seed=rollout.seed, keep_as=keep_as,
                rename=answer.rename)
    if not parsed.stream:
        finished = await gateway.complete(call)
        return Response(finished.body, media_type="application/json", headers={CALL_ID: finished.call_id})
    items = gateway.stream(call)
    first = await anext(items)  # binding, holding and rendering errors are still plain HTTP errors here
    assert isinstance(first, Started)

    async def replay() -> AsyncIterator[Started | Delta | Finished]:
        yield first
        async for item in items:
            yield item

    return StreamingResponse(answer.sse(replay()), media_type="text/event-stream", headers={CALL_ID: first.call_id})


#: The header that names the call, for a step reward (`POST /rollouts/{id}/reward` with `call_id`).
CALL_ID = "x-tether-call-id"
