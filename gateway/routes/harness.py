"""The APIs a harness speaks (OpenAI chat and completions, Anthropic messages), bound to a rollout.

Mounted twice: at the root (the rollout comes from the token used as the API
key) and under /rollouts/{rollout_id} (from the path, for harnesses whose
base URL can be set but whose key cannot). Every call takes the same way
through `Gateway`; only parsing and the shape of the answer differ.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel

from gateway import anthropic_messages, openai_chat, openai_completions
from gateway.chat import ChatRequest, Generation, TokenUsage
from gateway.choices import Delta
from gateway.protocol.anthropic import MessagesRequest
from gateway.protocol.openai import ChatCompletionRequest, CompletionRequest
from gateway.routes.common import AnthropicRoute, BoundRollout, OpenAIRoute, Service, Settings, parse_body
from gateway.service import Call, Finished, Gateway, Started
from schemas.rollout_token import Claims


class HarnessRequest(Protocol):
    stream: bool

    def to_chat(self) -> ChatRequest: ...


class Responder(Protocol):
    """How one protocol shows a call's result: a whole body, or its event stream."""

    def body(self, generations: list[Generation], usage: TokenUsage, version: int) -> BaseModel: ...

    def sse(self, items: AsyncIterator[Started | Delta | Finished]) -> AsyncIterator[str]: ...


async def _serve(gateway: Gateway, rollout: Claims, api: str, raw: str, parsed: HarnessRequest,
                 answer: Responder) -> Response:
    call = Call(rollout_id=rollout.rollout_id, api=api, request_json=raw, chat=parsed.to_chat(),
                respond=answer.body, issued_at=rollout.issued_at)
    if not parsed.stream:
        finished = await gateway.complete(call)
        return Response(finished.body, media_type="application/json")
    items = gateway.stream(call)
    first = await anext(items)  # binding, holding and rendering errors are still plain HTTP errors here
    assert isinstance(first, Started)

    async def replay() -> AsyncIterator[Started | Delta | Finished]:
        yield first
        async for item in items:
            yield item

    return StreamingResponse(answer.sse(replay()), media_type="text/event-stream")


openai = APIRouter(route_class=OpenAIRoute)
anthropic = APIRouter(route_class=AnthropicRoute)


@openai.post("/v1/chat/completions")
async def chat_completions(request: Request, rollout: BoundRollout, gateway: Service, settings: Settings) -> Response:
    parsed, raw = await parse_body(request, ChatCompletionRequest, settings)
    answer = openai_chat.Responder(parsed, gateway.renderer.token_text)
    return await _serve(gateway, rollout, "openai.chat", raw, parsed, answer)


@openai.post("/v1/completions")
async def completions(request: Request, rollout: BoundRollout, gateway: Service, settings: Settings) -> Response:
    parsed, raw = await parse_body(request, CompletionRequest, settings)
    answer = openai_completions.Responder(parsed, gateway.renderer.token_text)
    return await _serve(gateway, rollout, "openai.completions", raw, parsed, answer)


@openai.get("/v1/models")
async def models(rollout: BoundRollout, gateway: Service) -> Response:
    """Bound like a call (the key must be a rollout's): one model, the one the engines serve."""
    return JSONResponse({"object": "list", "data": [
        {"id": gateway.model, "object": "model", "created": 0, "owned_by": "tether"}]})


@anthropic.post("/v1/messages")
async def messages(request: Request, rollout: BoundRollout, gateway: Service, settings: Settings) -> Response:
    parsed, raw = await parse_body(request, MessagesRequest, settings)
    return await _serve(gateway, rollout, "anthropic.messages", raw, parsed, anthropic_messages.Responder(parsed))


router = APIRouter()
router.include_router(openai)
router.include_router(anthropic)
