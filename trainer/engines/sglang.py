"""SGLang's weight API (read from SGLang 0.5.23, `sglang/srt/entrypoints/http_server.py`).

Every route is on by default (`--enable-memory-saver` makes the memory
routes free anything). Weight routes answer `{"success": bool, "message"}`,
200 or 400; distributed updates run inside a begin/end session:

    held       GET  /model_info                       {"weight_version": "<label>", ...} ("default" at launch)
    workers    GET  /server_info                      {"tp_size": n, ...}
    pause      POST /pause_generation {"mode": "abort"}
    resume     POST /continue_generation {}
    sleep      POST /release_memory_occupation {"tags": null}     (200, body null: weights, kv_cache, cuda_graph)
    wake       POST /resume_memory_occupation {"tags": ["weights"]}, then {"tags": ["kv_cache", "cuda_graph"]}
    load       POST /update_weights_from_disk {"model_path", "weight_version", "flush_cache": true}
    join       POST /init_weights_update_group {master_address, master_port, rank_offset, world_size, group_name,
                                                backend}
    begin      POST /begin_weight_update {}
    receive    POST /update_weights_from_distributed {names, dtypes, shapes, group_name, flush_cache: false}
    end        POST /end_weight_update {}, then POST /update_weight_version {"new_version", "abort_all_requests": false}
    abandon    POST /end_weight_update {}, POST /destroy_weights_update_group {"group_name"} (refusals ignored)
    reset      POST /flush_cache                       text, 200 or 400
    adapter    POST /unload_lora_adapter {"lora_name"}, then /load_lora_adapter {"lora_name", "lora_path"},
               then POST /update_weight_version               {"success", "error_message", "loaded_adapters"}

An adapter (`lora:` runs; `--enable-lora` with `--max-lora-rank` and
`--lora-target-modules`) is served under one name for the whole run
(`schemas.adapters.SERVED_NAME`). SGLang reloads nothing in place, so each
version unloads the previous one (its in-flight requests finish first; the
fleet has paused generation) and loads its own folder; each load gets a new
id that keys its radix-cache entries, so no stale prefix is reused.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from schemas.adapters import SERVED_NAME, is_adapter
from trainer.engines.base import Bucket, GroupInfo, WakeTag, label, version_of
from trainer.engines.http import Http
from trainer.errors import EngineError


class SglangReplica:
    def __init__(self, url: str, timeout_s: float = 600.0) -> None:
        self.url = url
        self._http = Http(url, timeout_s)
        self._group = "weight_update_group"

    async def _weights(self, phase: str, path: str, body: dict[str, Any]) -> None:
        answer = await self._http.json(phase, "POST", path, body=body)
        if isinstance(answer, dict) and answer.get("success") is False:  # 200 with success false: not seen, guarded
            why = answer.get("message") or answer.get("error_message")
            raise EngineError(f"engine {self.url}: {phase} ({path}) failed: {why}")

    async def held(self) -> int | None:
        return version_of((await self._http.json("model info", "GET", "/model_info") or {}).get("weight_version"))

    async def workers(self) -> int:
        body = await self._http.json("server info", "GET", "/server_info")
        return int(body.get("tp_size", 1))

    async def pause(self) -> None:
        await self._http.call("pause", "POST", "/pause_generation", body={"mode": "abort"})

    async def resume(self) -> None:
        await self._http.call("resume", "POST", "/continue_generation", body={})

    async def sleep(self, level: int) -> None:
        # level 1 or 2 alike: SGLang releases weights and KV cache together (its memory saver keeps a copy)
        await self._http.call("release memory", "POST", "/release_memory_occupation", body={"tags": None})

    async def wake(self, tags: Sequence[WakeTag]) -> None:
        # releasing with no tags released the CUDA graphs too: they come back with the KV cache they run on
        names = [name for tag in tags for name in ((tag, "cuda_graph") if tag == "kv_cache" else (tag,))]
        await self._http.call("resume memory", "POST", "/resume_memory_occupation", body={"tags": names})

    async def load(self, folder: Path, version: int) -> None:
        if is_adapter(folder):
            await self._adapter(folder)
            await self._weights("label", "/update_weight_version",
                                {"new_version": label(version), "abort_all_requests": False})
            return
        await self._weights("update weights from disk", "/update_weights_from_disk", {
            "model_path": str(folder), "weight_version": label(version), "flush_cache": True})

    async def _adapter(self, folder: Path) -> None:
        loaded = await self._http.json("loaded models", "GET", "/v1/models")
        names = {m.get("id") for m in (loaded or {}).get("data", []) if isinstance(m, dict)}
        if SERVED_NAME in names:
            await self._weights("unload adapter", "/unload_lora_adapter", {"lora_name": SERVED_NAME})
        await self._weights("load adapter", "/load_lora_adapter", {"lora_name": SERVED_NAME, "lora_path": str(folder)})

    async def join(self, group: GroupInfo) -> None:
        self._group = group.name
        await self._weights("join the weight group", "/init_weights_update_group", {
            "master_address": group.address, "master_port": group.port, "rank_offset": group.rank_offset,
            "world_size": group.world_size, "group_name": group.name, "backend": group.backend})

    async def begin(self) -> None:
        await self._weights("begin weight update", "/begin_weight_update", {})

    async def receive(self, bucket: Bucket) -> None:
        await self._weights("update weights from distributed", "/update_weights_from_distributed", {
            "names": bucket.names, "dtypes": bucket.dtype_names, "shapes": bucket.shapes,
            "group_name": self._group, "flush_cache": False})

    async def end(self, version: int) -> None:
        await self._weights("end weight update", "/end_weight_update", {})
        await self._weights("label", "/update_weight_version",
                            {"new_version": label(version), "abort_all_requests": False})

    async def abandon(self) -> None:
        group = {"group_name": self._group}
        for path, body in (("/end_weight_update", {}), ("/destroy_weights_update_group", group)):
            with contextlib.suppress(EngineError):  # no session open, or no group left
                await self._http.call("abandon the weight group", "POST", path, body=body)

    async def reset_cache(self) -> None:
        await self._http.call("flush cache", "POST", "/flush_cache")

    async def aclose(self) -> None:
        await self._http.aclose()
