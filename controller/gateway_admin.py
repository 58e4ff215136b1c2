"""The gateway's admin API as the controller uses it: register a rollout before its harness starts, seal it after."""

from __future__ import annotations

import asyncio
import random

import httpx

from controller.errors import GatewayUnavailable


class GatewayAdmin:
    def __init__(self, url: str, admin_key: str, retries: int = 5,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.url = url.rstrip("/")
        self.retries = retries
        self._client = httpx.AsyncClient(base_url=self.url, headers={"authorization": f"Bearer {admin_key}"},
                                         timeout=httpx.Timeout(30.0, connect=5.0), transport=transport)

    async def _post(self, path: str, json: dict[str, object] | None = None, missing_ok: bool = False) -> None:
        for attempt in range(self.retries + 1):
            try:
                response = await self._client.post(path, json=json)
            except httpx.TransportError as exc:
                error: str = f"{exc!r}"
            else:
                if response.status_code < 300 or (missing_ok and response.status_code == 404):
                    return
                if response.status_code < 500:  # our request is wrong: retrying will not help
                    raise GatewayUnavailable(f"gateway {self.url}{path}: {response.status_code} {response.text[:300]}")
                error = f"{response.status_code} {response.text[:300]}"
            if attempt < self.retries:
                await asyncio.sleep(min(5.0, 0.2 * 2**attempt) * (0.5 + random.random()))
        raise GatewayUnavailable(f"gateway {self.url}{path}: {error}")

    async def register(self, rollout_id: str, run_id: str) -> None:
        await self._post("/admin/rollouts", {"rollout_id": rollout_id, "run_id": run_id})

    async def seal(self, rollout_id: str) -> None:
        """Idempotent; a gateway that never knew the rollout (restarted) has nothing to seal."""
        await self._post(f"/admin/rollouts/{rollout_id}/seal", missing_ok=True)

    async def close(self) -> None:
        await self._client.aclose()
