"""Anthropic's messages and count-tokens routes, answering errors as Anthropic's error events."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from gateway.api.anthropic.protocol import CountTokensRequest, MessagesRequest
from gateway.api.anthropic.serving import Responder
from gateway.api.serving import serve
from gateway.http.auth import BoundRollout
from gateway.http.body import parse_body
from gateway.http.deps import Service, Settings
from gateway.http.refusals import AnthropicRoute

router = APIRouter(route_class=AnthropicRoute)


@router.post("/v1/messages")
async def messages(request: Request, rollout: BoundRollout, gateway: Service, settings: Settings) -> Response:
    parsed, raw = await parse_body(request, MessagesRequest, settings)
    return await serve(gateway, rollout, "anthropic.messages", raw, parsed, Responder(parsed))


@router.post("/v1/messages/count_tokens")
async def count_tokens(request: Request, rollout: BoundRollout, gateway: Service, settings: Settings) -> Response:
    """What Claude Code asks before a long call: the prompt's length in the model's own tokens. Not recorded."""
    parsed, _ = await parse_body(request, CountTokensRequest, settings)
    count = await gateway.count_tokens(rollout.rollout_id, parsed.to_chat(), rollout.issued_at)
    return JSONResponse({"input_tokens": count})
