"""What every route needs: the service, who is calling, the body as sent, and errors in the caller's protocol.

A route class per protocol turns any `GatewayError` (from the route or its
dependencies), and any bug, into the error body its clients parse, so a
harness speaking Anthropic never sees an OpenAI error (nor a bare-text 500),
and counts and logs each error it answers (`refused`): a request refused
before admission leaves no other trace.
Bodies are read here, not by FastAPI: the size bound is enforced while a
chunked upload arrives, the text is kept exactly as sent for the record, and
what no later step could take (NaN, lone surrogates) is refused by field.
"""

from __future__ import annotations

import hmac
import json
import logging
import math
import re
from collections.abc import Callable, Coroutine
from dataclasses import replace
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException

from gateway.errors import BodyTooLarge, Forbidden, GatewayError, InternalError, InvalidRequest, Unauthorized
from gateway.service import Gateway
from gateway.settings import GatewaySettings
from schemas.rollout_token import Claims, claims
from schemas.validation import first_error

Model = TypeVar("Model", bound=BaseModel)
log = logging.getLogger(__name__)


# -- errors in the caller's protocol ---------------------------------------------------


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


# -- the service and its settings ------------------------------------------------------
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


# -- who is calling --------------------------------------------------------------------


def api_key(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return request.headers.get("x-api-key")


async def _bound_rollout(request: Request, settings: Settings) -> Claims:
    """The rollout this call writes to (and when its token was minted); a token can only write to its own."""
    path_rollout: str | None = request.path_params.get("rollout_id")  # the path only: never a query string
    key = api_key(request)
    token = claims(key, settings.secret) if key else None
    if path_rollout is not None:
        if token is not None and token.rollout_id != path_rollout:
            raise Forbidden(f"this key belongs to another rollout, not {path_rollout!r}")
        if token is None and settings.path_binding_requires_token:
            raise Unauthorized("this gateway needs the rollout's token as the API key")
        return token or Claims(path_rollout, None)
    if token is None:
        raise Unauthorized("use a rollout token as the API key, or a /rollouts/{id}/v1 base URL")
    return token


BoundRollout = Annotated[Claims, Depends(_bound_rollout)]


async def require_admin(request: Request, settings: Settings) -> None:
    if not hmac.compare_digest((api_key(request) or "").encode(), settings.admin_key.encode()):
        raise Unauthorized("admin endpoints need the admin key")


# -- the body --------------------------------------------------------------------------


async def read_body(request: Request, max_bytes: int) -> tuple[str, dict[str, Any]]:
    """The body as the harness sent it (kept for the record) and parsed."""
    declared = int(request.headers.get("content-length") or 0)
    if declared > max_bytes:
        raise BodyTooLarge(f"request body over {max_bytes} bytes")
    parts, size = [], 0
    async for part in request.stream():  # a chunked upload is capped as it arrives, not after
        size += len(part)
        if size > max_bytes:
            raise BodyTooLarge(f"request body over {max_bytes} bytes")
        parts.append(part)
    try:
        raw = b"".join(parts).decode()
        body = json.loads(raw, parse_constant=_not_json, parse_float=_finite)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise InvalidRequest(f"malformed JSON body: {exc}") from exc
    if not isinstance(body, dict):
        raise InvalidRequest("the body must be a JSON object")
    if _ESCAPED_SURROGATE.search(raw) and (field := lone_surrogate(body)) is not None:
        raise InvalidRequest(f"{field}: a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff escape) is not "
                             "text; send valid Unicode", field)
    return raw, body


def _not_json(constant: str) -> None:
    """NaN and Infinity: Python reads them, JSON has no such thing, and the record must stay JSON."""
    raise ValueError(f"{constant} is not a JSON value")


def _finite(number: str) -> float:
    """A number too large for a double (1e999) would be read as infinity: refused like Infinity itself."""
    value = float(number)
    if not math.isfinite(value):
        raise ValueError(f"{number[:20]} is out of range")
    return value


# A JSON escape in the surrogate range; the only way a lone surrogate gets in, since the bytes are strict UTF-8.
_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89abcdefABCDEF]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def lone_surrogate(body: Any) -> str | None:
    """The first field (a dotted path) whose name or text holds a lone surrogate, or None.

    No tokenizer, Avro encoder or JSON writer downstream can take one (the tokenizer's TypeError was a 500)."""
    stack: list[tuple[str, str, Any]] = [("", "", body)]  # (path, the key it is under, value)
    while stack:  # not recursive: json.loads accepts nesting deeper than the recursion limit leaves here
        path, key, value = stack.pop()
        if _SURROGATE.search(key) or (isinstance(value, str) and _SURROGATE.search(value)):
            return path.encode("utf-8", "backslashreplace").decode() or "body"  # a bad key is shown escaped
        if isinstance(value, dict):
            stack += [(f"{path}.{k}" if path else k, k, v) for k, v in reversed(value.items())]
        elif isinstance(value, list):
            stack += [(f"{path}.{i}" if path else str(i), "", v) for i, v in reversed(list(enumerate(value)))]
    return None


def parse(model: type[Model], body: dict[str, Any]) -> Model:
    """The body as `model`, or an InvalidRequest naming the first field at fault, as OpenAI words it."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        error = first_error(exc)
        if error.type == "extra_forbidden":
            error = replace(error, message="Unrecognized request argument supplied")
        raise InvalidRequest(error.line(), error.field) from exc


async def parse_body(request: Request, model: type[Model], settings: GatewaySettings) -> tuple[Model, str]:
    """Read and parse: the request as `model`, and its text as sent."""
    raw, body = await read_body(request, settings.max_body_bytes)
    return parse(model, body), raw
