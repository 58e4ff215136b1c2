"""The operator's view and hands: the gateway's state, and a manual pause and resume of calls."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field

from gateway.http.auth import require_admin
from gateway.http.body import parse_body
from gateway.http.deps import Service, Settings
from gateway.http.refusals import OpenAIRoute

router = APIRouter(prefix="/admin", route_class=OpenAIRoute, dependencies=[Depends(require_admin)])


class Pause(BaseModel):
    version: int = Field(ge=0)


@router.get("/state")
async def state(gateway: Service, settings: Settings) -> Response:
    gate = gateway.gate
    return JSONResponse({
        "gateway_id": settings.gateway_id, "run_id": settings.run_id, "model": gateway.model,
        "weight_version": gateway.version, "paused": gate.paused, "paused_for": gate.paused_for,
        "in_flight": gate.in_flight, "held": gate.held, "rollouts": len(gateway.rollouts),
    })


@router.post("/pause")
async def pause(request: Request, gateway: Service, settings: Settings) -> Response:
    """Hold new calls as a weight update would, and answer once the calls inside are done."""
    parsed, _ = await parse_body(request, Pause, settings)
    gateway.gate.pause(parsed.version)
    await gateway.gate.drained()
    return JSONResponse({"paused": True, "in_flight": gateway.gate.in_flight, "held": gateway.gate.held})


@router.post("/resume")
async def resume(gateway: Service) -> Response:
    gateway.gate.resume()
    return JSONResponse({"paused": False})
