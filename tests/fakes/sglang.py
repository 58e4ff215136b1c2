"""FakeSGLang: SGLang 0.5.23's weight, pause, memory and cache routes, in its wire format.

Read from SGLang 0.5.23 (`sglang/srt/entrypoints/http_server.py`, `managers/io_struct.py`, the scheduler's weight
updater): every route on by default; weight routes answer `{"success", "message"}` with 200, or 400 when
`success` is false; a body that fails validation gets 400 `{"object": "error", ...}`; distributed updates run
inside a begin/end session; a disk update renames the served model to its path. The weight group is joined
with the trainer's `TorchGroup`, as SGLang's workers join theirs (`init_custom_process_group`), over gloo
where SGLang's is NCCL. Routes under /fake/ are the fake's (`tests/fakes/held_weights.py`). With --enable-lora
the LoRA adapter routes load and unload adapters by name (`LoRAUpdateOutput`: 200, or 400 with `success` false),
and /v1/models lists them.

    python -m tests.fakes.sglang --model DIR --port 8400 [--api-key KEY] [--completions] [--enable-lora]

With --completions it also answers /v1/completions as SGLang does when asked `return_token_ids` (each choice's
`token_ids` and `prompt_token_ids`, `matched_stop`), with "weights LABEL", the label of the weights it holds.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Annotated, Any

import uvicorn
from fastapi import Body, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, ConfigDict

from tests.fakes.held_weights import HeldWeights, read_folder
from tests.fakes.vllm import add_completions
from trainer.engines.broadcast import TorchGroup

MEMORY_TAGS = ("weights", "kv_cache", "cuda_graph")


class _Req(BaseModel):
    model_config = ConfigDict(extra="ignore")  # msgspec structs with extra_behavior="ignore"
    rid: str | None = None


class PauseReq(_Req):
    mode: str = "abort"


class MemoryReq(_Req):
    tags: list[str] | None = None


class DiskReq(_Req):
    model_path: str
    load_format: str | None = None
    abort_all_requests: bool = False
    weight_version: str | None = None
    flush_cache: bool = True


class GroupReq(_Req):
    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    group_name: str = "weight_update_group"
    backend: str = "nccl"


class DistributedReq(_Req):
    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    group_name: str = "weight_update_group"
    flush_cache: bool = True
    abort_all_requests: bool = False
    weight_version: str | None = None


class VersionReq(_Req):
    new_version: str
    abort_all_requests: bool = True


def answer(success: bool, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"success": success, "message": message, **extra}, status_code=200 if success else 400)


OPEN = ("/health", "/health_generate", "/ready", "/metrics")  # never behind a key (srt/utils/auth.py)


class LoadLoRAAdapterReqInput(BaseModel):  # io_struct.py; unknown keys are ignored, as SGLang's dataclass does
    lora_name: str
    lora_path: str
    pinned: bool = False
    lora_id: str | None = None
    rid: str | None = None


class UnloadLoRAAdapterReqInput(BaseModel):
    lora_name: str
    lora_id: str | None = None
    rid: str | None = None


def lora_update(success: bool, error_message: str | None, loaded: dict[str, str] | None) -> JSONResponse:
    """LoRAUpdateOutput: 200 when it succeeded, 400 otherwise."""
    return JSONResponse({"rid": None, "http_worker_ipc": None, "success": success, "error_message": error_message,
                         "loaded_adapters": loaded}, status_code=200 if success else 400)


def create_app(held: HeldWeights, api_key: str | None = None, lora: bool = False) -> FastAPI:
    app = FastAPI()
    session: dict[str, Any] = {"open": False, "groups": {}}
    served = {"model_path": str(held.model)}

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"object": "error", "message": f"{exc} {exc.errors()}", "type": "Bad Request",
                             "param": None, "code": 400}, status_code=400)

    @app.middleware("http")
    async def faults(request: Request, call_next: Any) -> Response:
        guarded = api_key is not None and not request.url.path.startswith(("/fake/", *OPEN))
        if guarded and request.headers.get("authorization") != f"Bearer {api_key}":
            return JSONResponse({"error": "Unauthorized"}, status_code=401)
        if not request.url.path.startswith("/fake/") and held.fails(request.url.path):
            return answer(False, f"injected failure of {request.url.path}")
        response: Response = await call_next(request)
        return response

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:  # ModelList of ModelCards: the served model, then each adapter
        name = served["model_path"]
        cards = [{"id": name, "object": "model", "created": 0, "owned_by": "sglang", "root": name, "parent": None,
                  "max_model_len": None}]
        cards += [{"id": adapter, "object": "model", "created": 0, "owned_by": "sglang", "root": path,
                   "parent": name, "max_model_len": None} for adapter, (path, _) in held.adapters.items()]
        return {"object": "list", "data": cards}

    def loaded() -> dict[str, str]:
        return {name: path for name, (path, _) in held.adapters.items()}

    @app.post("/load_lora_adapter")
    async def load_lora(body: Annotated[LoadLoRAAdapterReqInput, Body()]) -> JSONResponse:
        if not lora:
            return lora_update(False, "LoRA is not enabled. Please set `--enable-lora` to enable LoRA.", None)
        if body.lora_name in held.adapters:
            return lora_update(False, f"Failed to load LoRA adapter {body.lora_name} because it is already loaded",
                               None)
        try:
            fingerprint = await asyncio.to_thread(held.read_adapter, Path(body.lora_path))
        except FileNotFoundError as exc:
            return lora_update(False, str(exc), loaded())
        held.adapters[body.lora_name] = (body.lora_path, fingerprint)
        return lora_update(True, "", loaded())

    @app.post("/unload_lora_adapter")
    async def unload_lora(body: Annotated[UnloadLoRAAdapterReqInput, Body()]) -> JSONResponse:
        if not lora:
            return lora_update(False, "LoRA is not enabled. Please set `--enable-lora` to enable LoRA.", None)
        if body.lora_name not in held.adapters:
            return lora_update(False, f"LoRA with name {body.lora_name} does not exist. Loaded LoRAs: "
                                      f"{sorted(held.adapters)}", None)
        del held.adapters[body.lora_name]
        return lora_update(True, "", loaded())

    @app.get("/model_info")
    async def model_info() -> dict[str, Any]:
        return {"model_path": served["model_path"], "served_model_name": served["model_path"],
                "tokenizer_path": str(held.model), "is_generation": True, "weight_version": held.label}

    @app.get("/server_info")
    async def server_info() -> dict[str, Any]:
        return {"tp_size": held.tp_size, "dp_size": 1, "version": "0.5.23"}

    @app.post("/pause_generation")
    async def pause(body: Annotated[PauseReq, Body()]) -> dict[str, Any]:
        held.paused = True
        return {"message": "Generation paused successfully.", "status": "ok"}

    @app.post("/continue_generation")
    async def resume(body: Annotated[_Req, Body()]) -> dict[str, Any]:
        held.paused = False
        return {"message": "Generation continued successfully.", "status": "ok"}

    @app.post("/release_memory_occupation")
    async def release(body: Annotated[MemoryReq, Body()]) -> Response:
        released: set[str] = session.setdefault("released", set())
        released.update(body.tags or MEMORY_TAGS)  # no tags: all three (sglang/srt/constants.py)
        held.sleeping = True
        return JSONResponse(None)

    @app.post("/resume_memory_occupation")
    async def occupy(body: Annotated[MemoryReq, Body()]) -> Response:
        released: set[str] = session.setdefault("released", set())
        released.difference_update(body.tags or MEMORY_TAGS)
        held.sleeping = bool(released)  # asleep until everything released is back (CUDA graphs included)
        return JSONResponse(None)

    @app.post("/update_weights_from_disk")
    async def from_disk(body: Annotated[DiskReq, Body()]) -> JSONResponse:
        try:
            held.tensors = await asyncio.to_thread(read_folder, Path(body.model_path))
        except (OSError, ValueError) as exc:
            return answer(False, f"Failed to get weights iterator: {exc}.", num_paused_requests=0)
        served["model_path"] = body.model_path
        message = "Succeeded to update model weights."
        if body.weight_version is not None:
            held.label = body.weight_version
            message += f" Weight version updated to {body.weight_version}."
        return answer(True, message, num_paused_requests=0)

    @app.post("/init_weights_update_group")
    async def init_group(body: Annotated[GroupReq, Body()]) -> JSONResponse:
        group = TorchGroup(backend="gloo", address=body.master_address, port=body.master_port,
                           rank=body.rank_offset, world_size=body.world_size, name=body.group_name, timeout_s=60)
        try:
            await asyncio.to_thread(group.join)
        except RuntimeError as exc:
            return answer(False, f"Failed to initialize custom process group: {exc}.")
        session["groups"][body.group_name] = group
        return answer(True, "Succeeded to initialize custom process group.")

    @app.post("/destroy_weights_update_group")
    async def destroy_group(group_name: Annotated[str, Body(embed=True)] = "weight_update_group") -> JSONResponse:
        group = session["groups"].pop(group_name, None)
        if group is None:
            return answer(False, "The group to be destroyed does not exist.")
        group.close()
        return answer(True, "Succeeded to destroy custom process group.")

    @app.post("/begin_weight_update")
    async def begin(body: Annotated[_Req, Body()]) -> JSONResponse:
        if session["open"]:
            return answer(False, "a weight-update session is already open; call end_weight_update() first")
        session["open"] = True
        return answer(True, "Success")

    @app.post("/end_weight_update")
    async def end(body: Annotated[_Req, Body()]) -> JSONResponse:
        if not session["open"]:
            return answer(False, "no weight-update session is open; call begin_weight_update() first")
        session["open"] = False
        return answer(True, "Success")

    @app.post("/update_weights_from_distributed")
    async def from_distributed(body: Annotated[DistributedReq, Body()]) -> JSONResponse:
        if not session["open"]:
            return answer(False, "update_weights_from_distributed must run between begin_weight_update() and "
                                 "end_weight_update()")
        group = session["groups"].get(body.group_name)
        if group is None:
            return answer(False, f"Failed to update parameter online: no group {body.group_name}.")
        try:
            received = await asyncio.to_thread(held.receive, group, body.names, body.dtypes, body.shapes)
        except (ValueError, RuntimeError) as exc:
            return answer(False, f"Failed to update parameter online: {exc}.")
        held.tensors = {**(held.tensors or {}), **received}  # loaded into the model as it arrives
        message = "Succeeded to update parameter online."
        if body.weight_version is not None:
            held.label = body.weight_version
            message += f" Weight version updated to {body.weight_version}."
        return answer(True, message)

    @app.post("/update_weight_version")
    async def update_weight_version(body: Annotated[VersionReq, Body()]) -> JSONResponse:
        held.label = body.new_version
        return answer(True, f"Weight version updated to {body.new_version}", new_version=body.new_version)

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> PlainTextResponse:
        return PlainTextResponse("Cache flushed.\nPlease check backend logs for more details. (When there are "
                                 "running or waiting requests, the operation will not be performed.)\n")

    @app.get("/fake/state")
    async def state() -> dict[str, object]:
        return held.state()

    @app.post("/fake/fail")
    async def fail(path: Annotated[str, Body()], times: Annotated[int, Body()] = 1) -> dict[str, Any]:
        held.failing[path] = times
        return {"failing": held.failing}

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--api-key", default=None, help="as SGLang's: every route but health needs it as a bearer")
    parser.add_argument("--completions", action="store_true", help='answer /v1/completions with "weights LABEL"')
    parser.add_argument("--enable-lora", action="store_true", help="as SGLang's: the LoRA adapter routes work")
    args = parser.parse_args()
    held = HeldWeights(args.model)
    app = create_app(held, args.api_key, lora=args.enable_lora)
    if args.completions:  # SGLang's OpenAI completions with return_token_ids: vLLM's choice fields, matched_stop
        def answer(body: dict[str, Any]) -> str:  # SGLang: "base:adapter" as the model, else `lora_path`
            model = str(body.get("model"))
            adapter = model.split(":", 1)[1] if ":" in model and model != str(held.model) else body.get("lora_path")
            if adapter is None:
                return f"weights {held.label}"
            if adapter not in held.adapters:
                raise LookupError(f"LoRA adapter {adapter} is not loaded")
            return f"weights {held.label} adapter {adapter}"

        add_completions(app, str(args.model), lambda prompt: f"weights {held.label}", stop_key="matched_stop",
                        answer=answer)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
