"""What a route is given: the service and its settings, set on the app by its lifespan."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from gateway.service import Gateway
from gateway.settings import GatewaySettings

# Dependencies are `async def` though none awaits: FastAPI runs a plain `def` on its thread pool, and three thread
# hops a call were a tenth of the gateway's CPU at 64 clients.


async def _settings(request: Request) -> GatewaySettings:
    settings: GatewaySettings = request.app.state.settings
    return settings


async def _gateway(request: Request) -> Gateway:
    gateway: Gateway = request.app.state.gateway  # set by the app's lifespan, before any request
    return gateway


Settings = Annotated[GatewaySettings, Depends(_settings)]
Service = Annotated[Gateway, Depends(_gateway)]
