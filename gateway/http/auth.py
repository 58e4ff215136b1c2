"""Who is calling: a rollout's token (or a rollout bound by the path), or the admin key."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request

from gateway.errors import Forbidden, Unauthorized
from gateway.http.deps import Settings
from schemas.rollout_token import Claims, claims


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
