"""The APIs a harness speaks, one folder each, as vLLM's OpenAI server lays them out: the wire format's models
(`protocol.py`), the answer writer (`serving.py`, or one per endpoint) and the routes (`router.py`) side by side.

`harness_router` holds them all; the app mounts it twice: at the root (the
rollout comes from the token used as the API key) and under
/rollouts/{rollout_id} (from the path, for harnesses whose base URL can be set
but whose key cannot). Every call takes the same way through `Gateway`
(`serving.serve`); only parsing and the shape of the answer differ.
"""

from __future__ import annotations

from fastapi import APIRouter

from gateway.api.anthropic.router import router as anthropic
from gateway.api.openai.router import router as openai
from gateway.api.responses.router import router as responses

harness_router = APIRouter()
harness_router.include_router(openai)
harness_router.include_router(responses)
harness_router.include_router(anthropic)
