"""The embedded engine (`engine/`): its checkpoint route for the disk path, vLLM's routes for the rest.

    held       GET  /v1/weights                 {"version": n, "paused": bool}
    load       POST /v1/weights/load            {"path", "version"}  (drains, swaps, labels, clears the prefix cache)
    pause, resume, sleep, wake, reset: vLLM's routes and bodies (`trainer/engines/vllm.py`)

It has no weight group: `transfer: distributed` is for vLLM and SGLang (the
trainer's configuration refuses it here).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from trainer.engines.base import Bucket, GroupInfo, WakeTag
from trainer.engines.http import Http
from trainer.engines.vllm import VllmReplica
from trainer.errors import EngineError


class TetherReplica:
    def __init__(self, url: str, timeout_s: float = 600.0) -> None:
        self.url = url
        self._http = Http(url, timeout_s)
        self._vllm = VllmReplica(url, timeout_s)  # the routes it shares with vLLM

    async def held(self) -> int | None:
        return int((await self._http.json("weights", "GET", "/v1/weights"))["version"])

    async def workers(self) -> int:
        return 1

    async def pause(self) -> None:
        await self._vllm.pause()

    async def resume(self) -> None:
        await self._vllm.resume()

    async def sleep(self, level: int) -> None:
        await self._vllm.sleep(level)

    async def wake(self, tags: Sequence[WakeTag]) -> None:
        await self._vllm.wake(tags)

    async def load(self, folder: Path, version: int) -> None:
        await self._http.call("load", "POST", "/v1/weights/load", body={"path": str(folder), "version": version})

    def _no_group(self) -> EngineError:
        return EngineError(f"engine {self.url}: the embedded engine has no weight group (transfer: disk)")

    async def join(self, group: GroupInfo) -> None:
        raise self._no_group()

    async def begin(self) -> None:
        raise self._no_group()

    async def receive(self, bucket: Bucket) -> None:
        raise self._no_group()

    async def end(self, version: int) -> None:
        raise self._no_group()

    async def abandon(self) -> None:
        pass  # never in a group

    async def reset_cache(self) -> None:
        await self._vllm.reset_cache()

    async def aclose(self) -> None:
        await self._http.aclose()
        await self._vllm.aclose()
