"""The inference engines behind the gateway, spoken to in vLLM's token-in, token-out completions API.

A rollout is pinned to one engine (rendezvous hashing of its id over the
replicas that may serve it, `gateway/replicas.py`), so its calls reuse that
engine's prefix cache, and only the rollouts of a replica that drops out
move. Connection errors and 5xx are retried with jittered exponential
backoff, a bounded number of times, and only before any output reached the
caller.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import random
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import orjson

from gateway.errors import EngineFailed, InvalidRequest, NoReplicaReady
from gateway.replicas import VERSION_ROUTE, held_version, routable

log = logging.getLogger("tether.gateway")

# Before any output: the engine is not there, dropped the connection, or is restarting.
RETRYABLE = (aiohttp.ClientConnectionError, asyncio.TimeoutError)


class EnginePool:
    """aiohttp, not httpx: at hundreds of calls a second the client's own cost is the gateway's cost."""

    def __init__(self, urls: list[str], retries: int = 3, backoff_s: float = 0.2, timeout_s: float = 600.0,
                 api_key: str | None = None, hold_s: float = 60.0) -> None:
        if not urls:
            raise ValueError("at least one engine URL is needed")
        self.urls = [u.rstrip("/") for u in urls]
        self.retries = retries
        self.backoff_s = backoff_s
        self._timeout = aiohttp.ClientTimeout(total=timeout_s, connect=5.0)
        self._session: aiohttp.ClientSession | None = None
        self._headers = {**_JSON, **({"authorization": f"Bearer {api_key}"} if api_key else {})}
        self.routable = list(self.urls)  # those a call may go to (`watch`)
        self.hold_s = hold_s  # how long a call waits for a replica to hold the current version
        self._ready = asyncio.Event()  # some replica is routable
        self._ready.set()
        self._answered = False  # some replica has answered the version route (then silence is not consent)

    @property
    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:  # created inside the running loop
            self._session = aiohttp.ClientSession(
                timeout=self._timeout, connector=aiohttp.TCPConnector(limit=1024, limit_per_host=512))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def choose(self, rollout_id: str) -> str:
        """`pick`, once some replica holds the current version (waiting up to `hold_s` for the trainer to bring
        one up)."""
        if not self.routable:
            try:
                await asyncio.wait_for(self._ready.wait(), self.hold_s)
            except TimeoutError:
                raise NoReplicaReady("no engine replica holds the current weight version (a restarted one is "
                                     "being brought up); try again", retry_after_s=5.0) from None
        return self.pick(rollout_id)

    def pick(self, rollout_id: str) -> str:
        if len(self.routable) == 1:
            return self.routable[0]
        key = rollout_id.encode()
        return max(self.routable, key=lambda url: hashlib.blake2b(key + url.encode(), digest_size=8).digest())

    async def watch(self, kind: str, current: Callable[[], int], every_s: float) -> None:
        """Forever: which replicas hold at least the version `current()` names (`gateway/replicas.py`)."""
        path, _ = VERSION_ROUTE[kind]
        timeout = aiohttp.ClientTimeout(total=max(every_s, 1.0))
        while True:
            held: dict[str, int | None] = {}
            for url in self.urls:
                try:
                    async with self._http.get(f"{url}{path}", timeout=timeout, headers=self._headers) as response:
                        held[url] = held_version(kind, _parse(await response.read())) if response.ok else None
                except (TimeoutError, aiohttp.ClientError, ValueError, AttributeError):
                    held[url] = None
            ready = sorted(routable(held, current(), self._answered))
            self._answered = self._answered or any(version is not None for version in held.values())
            if ready != sorted(self.routable):
                log.warning("engine replicas now routed to: %s (held: %s, current version %d)", ready, held,
                            current())
                self.routable = [u for u in self.urls if u in ready]
                if self.routable:
                    self._ready.set()
                else:
                    self._ready.clear()
            await asyncio.sleep(every_s)

    async def model(self) -> str:
        """The name the first engine serves (what the gateway passes on in every request)."""
        models = await self._with_retries("GET", f"{self.urls[0]}/v1/models", None)
        return str(models["data"][0]["id"])

    async def complete(self, rollout_id: str, body: dict[str, Any]) -> dict[str, Any]:
        url = await self.choose(rollout_id)
        return await self._with_retries("POST", f"{url}/v1/completions", {**body, "stream": False})

    async def stream(self, rollout_id: str, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """Engine chunks as they come; retried while nothing has been read yet."""
        url = f"{await self.choose(rollout_id)}/v1/completions"
        started = False
        for attempt in range(self.retries + 1):
            try:
                async with self._http.post(url, data=orjson.dumps({**body, "stream": True}),
                                           headers=self._headers) as response:
                    if response.status >= 400:
                        self._raise_for(response.status, await response.text(), retryable_left=attempt < self.retries)
                    async for line in _lines(response.content):
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        chunk: dict[str, Any] = _parse(line[6:])
                        if "error" in chunk:
                            raise EngineFailed(f"engine error mid-stream: {chunk['error'].get('message')}")
                        started = True
                        yield chunk
                    return
            except (*RETRYABLE, _Retry) as exc:
                if started or attempt == self.retries:  # output already went out: a retry would repeat it
                    raise EngineFailed(f"engine at {url} failed: {exc!r}") from exc
                await self._sleep(attempt)
            except (aiohttp.ClientError, ValueError) as exc:
                raise EngineFailed(f"engine at {url} answered badly: {exc!r}") from exc

    async def _with_retries(self, method: str, url: str, body: dict[str, Any] | None) -> dict[str, Any]:
        for attempt in range(self.retries + 1):
            try:
                data = orjson.dumps(body) if body is not None else None
                async with self._http.request(method, url, data=data, headers=self._headers) as response:
                    raw = await response.read()
                    if response.status < 400:
                        result: dict[str, Any] = _parse(raw)
                        return result
                    self._raise_for(response.status, raw.decode(errors="replace"),
                                    retryable_left=attempt < self.retries)
            except (*RETRYABLE, _Retry) as exc:
                if attempt == self.retries:
                    raise EngineFailed(f"engine at {url} failed after {attempt + 1} attempts: {exc!r}") from exc
            except (aiohttp.ClientError, ValueError) as exc:
                raise EngineFailed(f"engine at {url} answered badly: {exc!r}") from exc
            await self._sleep(attempt)
        raise AssertionError("unreachable")

    def _raise_for(self, status: int, text: str, retryable_left: bool) -> None:
        message = _error_message(text)
        if status >= 500 and retryable_left:
            raise _Retry(f"{status}: {message}")
        if status >= 500:
            raise EngineFailed(f"engine answered {status}: {message}")
        if status in (401, 403):  # the gateway's credentials, not the caller's input
            raise EngineFailed(f"engine refused the gateway ({status}: {message}); check engine_api_key")
        raise InvalidRequest(message)  # the engine refused what we sent: the caller's input

    async def _sleep(self, attempt: int) -> None:
        await asyncio.sleep(self.backoff_s * (2**attempt) * (0.5 + random.random()))


_JSON = {"content-type": "application/json"}


def _parse(text: str | bytes) -> Any:
    """orjson (half the stdlib's time on 2,000 token ids; it writes them 13x faster); the stdlib for what only it reads
    (NaN, Infinity, which some servers write for a -inf logprob)."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


class _Retry(Exception):
    """A 5xx worth another try."""


def _error_message(text: str) -> str:
    try:
        body = json.loads(text)
        return str(body.get("error", {}).get("message") or body.get("message") or body)
    except (json.JSONDecodeError, AttributeError):
        return text[:500]


async def _lines(content: aiohttp.StreamReader) -> AsyncIterator[str]:
    """Server-sent event lines of any length: the engine's first chunk carries the whole prompt's token ids,
    past aiohttp's line limit for a long prompt."""
    pending = b""
    async for data in content.iter_any():
        pending += data
        *lines, pending = pending.split(b"\n")
        for line in lines:
            yield line.decode().strip()
    if pending:
        yield pending.decode().strip()
