"""A rollout's life at the gateway: registered by the controller, rewarded by its harness, sealed."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field

from gateway.errors import Forbidden
from gateway.routes.common import OpenAIRoute, Service, Settings, api_key, parse_body, require_admin
from schemas.rollout_token import Claims, claims

router = APIRouter(route_class=OpenAIRoute)


class Register(BaseModel):
    rollout_id: str = Field(min_length=1)
    run_id: str | None = None


class Reward(BaseModel):
    reward: float
    details: dict[str, Any] | None = None


async def _rollout_token(request: Request, rollout_id: str, settings: Settings) -> Claims:
    """Only the rollout's own harness may speak for it."""
    key = api_key(request)
    found = claims(key, settings.secret) if key else None
    if found is None or found.rollout_id != rollout_id:
        raise Forbidden("a reward needs this rollout's token as the API key")
    return found


@router.post("/admin/rollouts", dependencies=[Depends(require_admin)])
async def register(request: Request, gateway: Service, settings: Settings) -> Response:
    parsed, _ = await parse_body(request, Register, settings)
    rollout = gateway.register(parsed.rollout_id, parsed.run_id or settings.run_id)
    return JSONResponse({"rollout_id": rollout.rollout_id, "run_id": rollout.run_id})


@router.post("/admin/rollouts/{rollout_id}/seal", dependencies=[Depends(require_admin)])
async def seal(rollout_id: str, gateway: Service) -> Response:
    call_ids = await gateway.seal(rollout_id)
    return JSONResponse({"rollout_id": rollout_id, "n_calls": len(call_ids), "call_ids": call_ids})


@router.post("/rollouts/{rollout_id}/reward")
async def reward(request: Request, rollout_id: str, gateway: Service, settings: Settings,
                 token: Annotated[Claims, Depends(_rollout_token)]) -> Response:
    parsed, _ = await parse_body(request, Reward, settings)
    await gateway.report_reward(rollout_id, parsed.reward, parsed.details, token.issued_at)
    return JSONResponse({"rollout_id": rollout_id, "reward": parsed.reward})
