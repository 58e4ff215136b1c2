"""One HTTP exchange with a replica, its failures mapped to `EngineError` at this one place.

A replica behind a key (SGLang's `--api-key` or `--admin-api-key`, vLLM's
`--api-key` for its /v1 routes) gets it as a bearer token from the
trainer's environment, `TETHER_TRAINER_ENGINE_API_KEY`, never from a file.
"""

from __future__ import annotations

import json
import os
from typing import Any, cast

import httpx

from trainer.errors import EngineError

Params = dict[str, str] | list[tuple[str, str]]
API_KEY_ENV = "TETHER_TRAINER_ENGINE_API_KEY"


class Http:
    def __init__(self, url: str, timeout_s: float) -> None:
        self.url = url.rstrip("/")
        key = os.environ.get(API_KEY_ENV)
        headers = {"authorization": f"Bearer {key}"} if key else {}
        self._client = httpx.AsyncClient(base_url=self.url, timeout=timeout_s, headers=headers)

    async def call(self, phase: str, method: str, path: str, *, body: Any = None,
                   params: Params | None = None) -> httpx.Response:
        """The response of a 2xx; anything else, or no answer, is the phase's failure."""
        try:
            response = await self._client.request(method, path, json=body, params=cast(Any, params))
        except httpx.HTTPError as exc:
            raise EngineError(f"engine {self.url}: {phase} ({method} {path}) got no answer: {exc!r}") from exc
        if not response.is_success:
            raise EngineError(f"engine {self.url}: {phase} ({method} {path}) refused: {response.status_code} "
                              f"{message(response)}")
        return response

    async def json(self, phase: str, method: str, path: str, *, body: Any = None,
                   params: Params | None = None) -> Any:
        response = await self.call(phase, method, path, body=body, params=params)
        if not response.content:
            return None  # some versions answer an empty 200 where later ones write JSON
        try:
            return response.json()
        except json.JSONDecodeError as exc:
            raise EngineError(f"engine {self.url}: {phase} ({method} {path}) answered no JSON: "
                              f"{response.text[:300]!r}") from exc

    async def aclose(self) -> None:
        await self._client.aclose()


def message(response: httpx.Response) -> str:
    """The error's words from any of the bodies engines write: OpenAI's envelope, `{"error": str}`,
    `{"success": false, "message"}` (or SGLang's `"error_message"`), FastAPI's `{"detail"}`, or plain text."""
    try:
        body = response.json()
    except json.JSONDecodeError:
        return response.text[:500]
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict):
            return str(error.get("message"))
        for key in ("error", "message", "error_message", "detail"):
            if body.get(key):
                return str(body[key])
    return str(body)[:500]
