"""OpenAI's chat completions, completions and models routes."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from gateway.api.openai import chat as chat_answers
from gateway.api.openai import completions as completion_answers
from gateway.api.openai.protocol import ChatCompletionRequest, CompletionRequest
from gateway.api.serving import serve
from gateway.http.auth import BoundRollout
from gateway.http.body import parse_body
from gateway.http.deps import Service, Settings
from gateway.http.refusals import OpenAIRoute

router = APIRouter(route_class=OpenAIRoute)


@router.post("/v1/chat/completions")
async def chat_completions(request: Request, rollout: BoundRollout, gateway: Service, settings: Settings) -> Response:
    parsed, raw = await parse_body(request, ChatCompletionRequest, settings)
    answer = chat_answers.Responder(parsed, gateway.renderer.token_text)
    return await serve(gateway, rollout, "openai.chat", raw, parsed, answer)


@router.post("/v1/completions")
async def completions(request: Request, rollout: BoundRollout, gateway: Service, settings: Settings) -> Response:
    parsed, raw = await parse_body(request, CompletionRequest, settings)
    answer = completion_answers.Responder(parsed, gateway.renderer.token_text)
    return await serve(gateway, rollout, "openai.completions", raw, parsed, answer)


@router.get("/v1/models")
async def models(rollout: BoundRollout, gateway: Service) -> Response:
    """Bound like a call (the key must be a rollout's): one model, the one the engines serve."""
    return JSONResponse({"object": "list", "data": [
        {"id": gateway.model, "object": "model", "created": 0, "owned_by": "tether"}]})
