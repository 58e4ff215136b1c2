"""vLLM's RL API (read from vLLM 0.34.0, `vllm/entrypoints/rl/online/api_router.py` and the dev routers).

The server needs `VLLM_SERVER_DEV_MODE=1` (every route below is a dev route),
`--weight-transfer-config '{"backend": "nccl"}'` for the distributed path and
`--enable-sleep-mode` for sleep to free memory:

    held       GET  /weight_info                  {"weight_version": "<label>"} ("default" at launch)
    workers    GET  /get_world_size?include_dp=true  {"world_size": n}
    pause      POST /pause?mode=wait              {"status": "paused"}
    resume     POST /resume                       {"status": "resumed"}
    sleep      POST /sleep?level=1|2              {"status": "sleeping", "level": n}
    wake       POST /wake_up?tags=weights&tags=kv_cache
    load       POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path", "is_checkpoint_format"}}
               POST /update_weight_version {"new_version": "<label>"}
    adapter    POST /v1/load_lora_adapter {"lora_name", "lora_path", "load_inplace": true}   (200, text)
               POST /update_weight_version {"new_version": "<label>"}
    join       POST /init_weight_transfer_engine {"init_info": {master_address, master_port, rank_offset, world_size}}
    begin      POST /start_weight_update
    receive    POST /update_weights {"update_info": {names, dtype_names, shapes, src: 0}}
    end        POST /finish_weight_update {"weight_version": "<label>"}
    abandon    POST /finish_weight_update, POST /shutdown_weight_transfer_engine (either may refuse: ignored)
    reset      POST /reset_prefix_cache              {"success": bool} (false while blocks are held: asked again)

An adapter (`lora:` runs; `serve/lora/api_router.py`, `--enable-lora` and
VLLM_ALLOW_RUNTIME_LORA_UPDATING=1, vLLM >= 0.15 for `load_inplace`) is loaded
under one name for the whole run (`schemas.adapters.SERVED_NAME`), each
version in place from its own checkpoint folder: the prefix cache keys blocks
by the adapter's path (vLLM >= 0.31), and the fleet resets it anyway.

Refusals come back as 400 (validation) or 500 (a worker's error) in the OpenAI
error envelope; `Http` maps both to `EngineError`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from pathlib import Path

from schemas.adapters import SERVED_NAME, is_adapter
from trainer.engines.base import Bucket, GroupInfo, WakeTag, label, version_of
from trainer.engines.http import Http
from trainer.errors import EngineError

RESET_ATTEMPTS = 10


class VllmReplica:
    def __init__(self, url: str, timeout_s: float = 600.0) -> None:
        self.url = url
        self._http = Http(url, timeout_s)

    async def held(self) -> int | None:
        return version_of((await self._http.json("weight info", "GET", "/weight_info") or {}).get("weight_version"))

    async def workers(self) -> int:
        body = await self._http.json("world size", "GET", "/get_world_size", params={"include_dp": "true"})
        return int(body["world_size"])

    async def pause(self) -> None:
        await self._http.call("pause", "POST", "/pause", params={"mode": "wait"})

    async def resume(self) -> None:
        await self._http.call("resume", "POST", "/resume")

    async def sleep(self, level: int) -> None:
        await self._http.call("sleep", "POST", "/sleep", params={"level": str(level)})

    async def wake(self, tags: Sequence[WakeTag]) -> None:
        await self._http.call("wake", "POST", "/wake_up", params=[("tags", t) for t in tags])

    async def load(self, folder: Path, version: int) -> None:
        if is_adapter(folder):
            await self._http.call("load adapter", "POST", "/v1/load_lora_adapter", body={
                "lora_name": SERVED_NAME, "lora_path": str(folder), "load_inplace": True})
            await self._http.call("label", "POST", "/update_weight_version", body={"new_version": label(version)})
            return
        await self._http.call("reload", "POST", "/collective_rpc", body={
            "method": "reload_weights", "args": [],
            "kwargs": {"weights_path": str(folder), "is_checkpoint_format": True}})
        await self._http.call("label", "POST", "/update_weight_version", body={"new_version": label(version)})

    async def join(self, group: GroupInfo) -> None:
        await self._http.call("join the weight group", "POST", "/init_weight_transfer_engine", body={"init_info": {
            "master_address": group.address, "master_port": group.port, "rank_offset": group.rank_offset,
            "world_size": group.world_size}})

    async def begin(self) -> None:
        await self._http.call("start weight update", "POST", "/start_weight_update")

    async def receive(self, bucket: Bucket) -> None:
        await self._http.call("update weights", "POST", "/update_weights", body={"update_info": {
            "names": bucket.names, "dtype_names": bucket.dtype_names, "shapes": bucket.shapes, "src": 0}})

    async def end(self, version: int) -> None:
        await self._http.call("finish weight update", "POST", "/finish_weight_update",
                              body={"weight_version": label(version)})

    async def abandon(self) -> None:
        for path in ("/finish_weight_update", "/shutdown_weight_transfer_engine"):
            with contextlib.suppress(EngineError):  # no session open (the failure ended it), or no group left
                await self._http.call("abandon the weight group", "POST", path)

    async def reset_cache(self) -> None:
        for attempt in range(RESET_ATTEMPTS):
            body = await self._http.json("reset prefix cache", "POST", "/reset_prefix_cache")
            if body is None or body.get("success", True):  # older servers answer an empty 200
                return
            await asyncio.sleep(0.1 * (attempt + 1))
        raise EngineError(f"engine {self.url}: reset prefix cache answered success false {RESET_ATTEMPTS} times "
                          "(blocks still held)")

    async def aclose(self) -> None:
        await self._http.aclose()
