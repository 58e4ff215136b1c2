"""The APIs a harness speaks (OpenAI chat, completions and responses, Anthropic messages), bound to a rollout.

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

from gateway import anthropic_messages, openai_chat, openai_completions, openai_responses
from gateway.chat import ChatRequest, Generation, Message, TokenUsage
from gateway.choices import Delta
from gateway.errors import InvalidRequest, ResponseNotFound
from gateway.protocol import responses as responses_api
from gateway.protocol.anthropic import CountTokensRequest, MessagesRequest
from gateway.protocol.openai import ChatCompletionRequest, CompletionRequest
from gateway.protocol.responses import RESPONSES, ResponsesRequest
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
                 answer: Responder, chat: ChatRequest | None = None, keep_as: str | None = None) -> Response:
    call = Call(rollout_id=rollout.rollout_id, api=api, request_json=raw, chat=chat or parsed.to_chat(),
                respond=answer.body, issued_at=rollout.issued_at, keep_as=keep_as)
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


@openai.post("/v1/responses")
async def responses(request: Request, rollout: BoundRollout, gateway: Service, settings: Settings) -> Response:
    parsed, raw = await parse_body(request, ResponsesRequest, settings)
    earlier = await _conversation(gateway, rollout, parsed.previous_response_id)
    answer = openai_responses.Responder(parsed)
    return await _serve(gateway, rollout, RESPONSES, raw, parsed, answer, chat=parsed.to_chat(earlier),
                        keep_as=answer.id if parsed.store else None)


@openai.get("/v1/responses/{response_id}")
async def stored_response(response_id: str, rollout: BoundRollout, gateway: Service) -> Response:
    """A response stored by this rollout (`store`, the default), while the rollout is open; any replica finds it."""
    kept = await gateway.answer(rollout.rollout_id, response_id, rollout.issued_at)
    if kept is None:
        raise ResponseNotFound(f"no stored response {response_id!r} in this rollout (sealed rollouts keep none)")
    return Response(kept[1], media_type="application/json")


async def _conversation(gateway: Gateway, rollout: Claims, response_id: str | None) -> tuple[Message, ...]:
    """What `previous_response_id` continues: each earlier request's input and its output, oldest first (their
    instructions are not carried over, as the API defines)."""
    turns: list[tuple[Message, ...]] = []
    seen: set[str] = set()
    while response_id is not None and response_id not in seen:
        seen.add(response_id)
        kept = await gateway.answer(rollout.rollout_id, response_id, rollout.issued_at)
        if kept is None:
            raise InvalidRequest(f"previous response {response_id!r} not found in this rollout (stored responses "
                                 "live while their rollout is open)", "previous_response_id")
        request = ResponsesRequest.model_validate_json(kept[0])
        turns.append(request.messages() + responses_api.Response.model_validate_json(kept[1]).as_messages())
        response_id = request.previous_response_id
    return tuple(m for turn in reversed(turns) for m in turn)


@openai.get("/v1/models")
async def models(rollout: BoundRollout, gateway: Service) -> Response:
    """Bound like a call (the key must be a rollout's): one model, the one the engines serve."""
    return JSONResponse({"object": "list", "data": [
        {"id": gateway.model, "object": "model", "created": 0, "owned_by": "tether"}]})


@anthropic.post("/v1/messages")
async def messages(request: Request, rollout: BoundRollout, gateway: Service, settings: Settings) -> Response:
    parsed, raw = await parse_body(request, MessagesRequest, settings)
    return await _serve(gateway, rollout, "anthropic.messages", raw, parsed, anthropic_messages.Responder(parsed))


@anthropic.post("/v1/messages/count_tokens")
async def count_tokens(request: Request, rollout: BoundRollout, gateway: Service, settings: Settings) -> Response:
    """What Claude Code asks before a long call: the prompt's length in the model's own tokens. Not recorded."""
    parsed, _ = await parse_body(request, CountTokensRequest, settings)
    count = await gateway.count_tokens(rollout.rollout_id, parsed.to_chat(), rollout.issued_at)
    return JSONResponse({"input_tokens": count})


router = APIRouter()
router.include_router(openai)
router.include_router(anthropic)
