"""Errors in the caller's protocol, and the gateway's own record of each one it answers.

A route class per protocol turns any `GatewayError` (from the route or its
dependencies), and any bug, into the error body its clients parse, so a
harness speaking Anthropic never sees an OpenAI error (nor a bare-text 500),
and counts and logs each error it answers (`refused`): a request refused
before admission leaves no other trace.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException

from gateway.errors import GatewayError, InternalError
from gateway.service import Gateway
from schemas.validation import first_error

log = logging.getLogger(__name__)


class OpenAIRoute(APIRoute):
    """A route whose errors are OpenAI's error objects (the gateway's own APIs use them too)."""

    @staticmethod
    def error_body(error: GatewayError) -> dict[str, Any]:
        return error.openai_body()

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handle = super().get_route_handler()

        async def answer(request: Request) -> Response:
            try:
                return await handle(request)
            except GatewayError as exc:
                refused(request, exc.status, exc.message)
                return JSONResponse(self.error_body(exc), status_code=exc.status, headers=exc.headers())
            except HTTPException as exc:
                refused(request, exc.status_code, str(exc.detail))
                raise  # FastAPI's own, answered by its handlers
            except RequestValidationError as exc:
                refused(request, 422, first_error(exc.errors()).line())
                raise
            except Exception as exc:  # a bug: still a 500, but logged, and one the caller's SDK can read
                log.exception("%s %s failed", request.method, request.url.path)
                error = InternalError(f"the gateway failed: {exc!r}")
                refused(request, error.status)
                return JSONResponse(self.error_body(error), status_code=error.status)

        return answer


def refused(request: Request, status: int, why: str | None = None) -> None:
    """The gateway's own record of a request it answered with an error: a count by route and status on /metrics,
    and one log line with the path, the status and what was wrong (never the body or the key).

    A request refused before admission (a parse error, a bad key) is recorded nowhere else."""
    gateway: Gateway | None = getattr(request.app.state, "gateway", None)  # set once the lifespan has started
    if gateway is not None:
        gateway.metrics.refused.labels(route_of(request), str(status)).inc()
    if why is not None:
        log.warning("refused %s %s: %d %s", request.method, request.url.path, status, why[:500])


def route_of(request: Request) -> str:
    """The request's route as its template (`/rollouts/{rollout_id}/v1/messages`), a label of bounded cardinality.

    Rebuilt from the path and its parameters: a route included under a prefix knows only its own part."""
    names = {str(value): name for name, value in request.path_params.items()}
    return "/".join(f"{{{names[part]}}}" if part in names else part for part in request.url.path.split("/"))


class AnthropicRoute(OpenAIRoute):
    """A route whose errors are Anthropic's error events."""

    @staticmethod
    def error_body(error: GatewayError) -> dict[str, Any]:
        return error.anthropic_body()
