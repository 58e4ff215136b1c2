"""Every API's routes in one router, for the app to mount (its own module, so that reading an API's wire format,
as the log reader does, does not import the routes and through them the service)."""

from __future__ import annotations

from fastapi import APIRouter

from gateway.api.anthropic.router import router as anthropic
from gateway.api.openai.router import router as openai
from gateway.api.responses.router import router as responses

harness_router = APIRouter()
harness_router.include_router(openai)
harness_router.include_router(responses)
harness_router.include_router(anthropic)
