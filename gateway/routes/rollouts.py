"""A rollout's life at the gateway: registered by the controller, rewarded by its harness, sealed."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field, model_validator

from gateway.errors import Forbidden
from gateway.http.auth import api_key, require_admin
from gateway.http.body import parse_body
from gateway.http.deps import Service, Settings
from gateway.http.refusals import OpenAIRoute
from schemas.rollout_token import Claims, claims

router = APIRouter(route_class=OpenAIRoute)


class Register(BaseModel):
    rollout_id: str = Field(min_length=1)
    run_id: str | None = None


class StepReward(BaseModel):
    call_id: str = Field(min_length=1)
    reward: float


class Reward(BaseModel):
    """The rollout's reward; with `call_id`, that call's alone (a step reward); `steps`: several at once."""

    reward: float | None = None
    call_id: str | None = Field(None, min_length=1)
    details: dict[str, Any] | None = None
    steps: list[StepReward] = Field(default_factory=list)

    @model_validator(mode="after")
    def _something(self) -> Reward:
        if self.reward is None and (self.call_id is not None or not self.steps):
            raise ValueError("reward is required (or steps: a list of {call_id, reward})")
        return self


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
    for step in parsed.steps:
        await gateway.report_reward(rollout_id, step.reward, None, token.issued_at, step.call_id)
    if parsed.reward is not None:
        await gateway.report_reward(rollout_id, parsed.reward, parsed.details, token.issued_at, parsed.call_id)
    return JSONResponse({"rollout_id": rollout_id, "reward": parsed.reward, "call_id": parsed.call_id,
                         "steps": len(parsed.steps)})
