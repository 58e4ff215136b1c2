"""OpenAI's Responses routes: a call, and a stored response read back (`previous_response_id` follows them)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from gateway.api.responses import protocol as responses_api
from gateway.api.responses.protocol import RESPONSES, ResponsesRequest
from gateway.api.responses.serving import Responder
from gateway.api.serving import serve
from gateway.chat import Message
from gateway.errors import InvalidRequest, ResponseNotFound
from gateway.http.auth import BoundRollout
from gateway.http.body import parse_body
from gateway.http.deps import Service, Settings
from gateway.http.refusals import OpenAIRoute
from gateway.service import Gateway
from schemas.rollout_token import Claims

router = APIRouter(route_class=OpenAIRoute)


@router.post("/v1/responses")
async def responses(request: Request, rollout: BoundRollout, gateway: Service, settings: Settings) -> Response:
    parsed, raw = await parse_body(request, ResponsesRequest, settings)
    earlier = await _conversation(gateway, rollout, parsed.previous_response_id)
    answer = Responder(parsed)
    return await serve(gateway, rollout, RESPONSES, raw, parsed, answer, chat=parsed.to_chat(earlier),
                       keep_as=answer.id if parsed.store else None)


@router.get("/v1/responses/{response_id}")
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
