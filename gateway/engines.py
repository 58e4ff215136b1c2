"""The inference engines behind the gateway, spoken to in vLLM's token-in, token-out completions API.

A rollout is pinned to one engine (hash of its id), so its calls reuse that
engine's prefix cache. Connection errors and 5xx are retried with jittered
exponential backoff, a bounded number of times, and only before any output
reached the caller.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
from collections.abc import AsyncIterator
from typing import Any

import httpx

from gateway.errors import EngineFailed, InvalidRequest

RETRYABLE = (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError, httpx.ReadError)


class EnginePool:
    def __init__(self, urls: list[str], retries: int = 3, backoff_s: float = 0.2, timeout_s: float = 600.0) -> None:
        if not urls:
            raise ValueError("at least one engine URL is needed")
        self.urls = [u.rstrip("/") for u in urls]
        self.retries = retries
        self.backoff_s = backoff_s
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=5.0),
                                       limits=httpx.Limits(max_connections=512, max_keepalive_connections=128))

    async def close(self) -> None:
        await self._http.aclose()

    def pick(self, rollout_id: str) -> str:
        digest = hashlib.sha256(rollout_id.encode()).digest()
        return self.urls[int.from_bytes(digest[:8], "big") % len(self.urls)]

    async def model(self) -> str:
        """The name the first engine serves (what the gateway passes on in every request)."""
        response = await self._with_retries(lambda: self._http.get(f"{self.urls[0]}/v1/models"))
        return str(response.json()["data"][0]["id"])

    async def complete(self, rollout_id: str, body: dict[str, Any]) -> dict[str, Any]:
        url = f"{self.pick(rollout_id)}/v1/completions"
        response = await self._with_retries(lambda: self._http.post(url, json={**body, "stream": False}))
        result: dict[str, Any] = response.json()
        return result

    async def stream(self, rollout_id: str, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """Engine chunks as they come; retried while nothing has been read yet."""
        url = f"{self.pick(rollout_id)}/v1/completions"
        for attempt in range(self.retries + 1):
            try:
                async with self._http.stream("POST", url, json={**body, "stream": True}) as response:
                    if response.status_code >= 400:
                        await response.aread()
                        self._raise_for(response, retryable_left=attempt < self.retries)
                    async for line in response.aiter_lines():
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        chunk: dict[str, Any] = json.loads(line[6:])
                        if "error" in chunk:
                            raise EngineFailed(f"engine error mid-stream: {chunk['error'].get('message')}")
                        yield chunk
                    return
            except (*RETRYABLE, _Retry) as exc:
                if attempt == self.retries:
                    raise EngineFailed(f"engine at {url} failed: {exc}") from exc
                await self._sleep(attempt)

    async def _with_retries(self, send: Any) -> httpx.Response:
        for attempt in range(self.retries + 1):
            try:
                response: httpx.Response = await send()
                if response.status_code < 400:
                    return response
                self._raise_for(response, retryable_left=attempt < self.retries)
            except (*RETRYABLE, _Retry) as exc:
                if attempt == self.retries:
                    raise EngineFailed(f"engine failed after {attempt + 1} attempts: {exc}") from exc
            await self._sleep(attempt)
        raise AssertionError("unreachable")

    def _raise_for(self, response: httpx.Response, retryable_left: bool) -> None:
        message = _error_message(response)
        if response.status_code >= 500 and retryable_left:
            raise _Retry(f"{response.status_code}: {message}")
        if response.status_code >= 500:
            raise EngineFailed(f"engine answered {response.status_code}: {message}")
        raise InvalidRequest(message)  # the engine refused what we sent: the caller's input

    async def _sleep(self, attempt: int) -> None:
        await asyncio.sleep(self.backoff_s * (2**attempt) * (0.5 + random.random()))


class _Retry(Exception):
    """A 5xx worth another try."""


def _error_message(response: httpx.Response) -> str:
    try:
        body = response.json()
        return str(body.get("error", {}).get("message") or body.get("message") or body)
    except (json.JSONDecodeError, AttributeError):
        return response.text[:500]
