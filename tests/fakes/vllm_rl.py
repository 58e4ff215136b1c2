"""FakeVLLM's RL side: vLLM 0.34.0's weight-transfer, pause, sleep, cache and LoRA routes, in its wire format.

Read from vLLM 0.34.0 (`vllm/entrypoints/rl/online/api_router.py`, `serve/dev/{sleep,cache,rpc}/api_router.py`,
`v1/worker/gpu_worker.py`): the routes as a server started with VLLM_SERVER_DEV_MODE=1 and
`--weight-transfer-config '{"backend": "nccl"}'` answers them, success bodies, 400 for a request that fails
validation and 500 for a worker's refusal, both in the OpenAI error envelope. The weight group is received over
gloo with the trainer's `TorchGroup` (vLLM's own is NCCL through PyNccl, which needs GPUs). Routes under /fake/
are the fake's (`tests/fakes/held_weights.py`). With VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 in its environment it
has vLLM's runtime LoRA routes (`serve/lora/api_router.py`, `openai/models/serving.py`): a plain-text 200 on
success, the OpenAI envelope otherwise, and the adapters listed by /v1/models.

    python -m tests.fakes.vllm_rl --model DIR --port 8300 [--completions]

With --completions it also answers /v1/completions (`tests/fakes/vllm.py`) with "weights LABEL", the label
of the weights it holds: a test reads from each recorded call which weights served it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path
from typing import Annotated, Any, Literal

import torch
import uvicorn
from fastapi import Body, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from tests.fakes.held_weights import HeldWeights, read_folder
from tests.fakes.vllm import add_completions
from trainer.engines.broadcast import TorchGroup, vllm_gloo_name

INIT_KEYS = ("master_address", "master_port", "rank_offset", "world_size")


def error(message: str, status: int, param: str | None = None) -> JSONResponse:
    kind = {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError"}.get(status, "Error")
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": status}},
                        status_code=status)


def create_app(held: HeldWeights) -> FastAPI:
    app = FastAPI()
    session: dict[str, Any] = {"active": False, "pending": {}, "group": None}

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"])
        return JSONResponse({"error": {"message": f"1 validation error:\n  {first}", "type": "Bad Request",
                                       "param": param, "code": 400}}, status_code=400)

    @app.middleware("http")
    async def faults(request: Request, call_next: Any) -> Response:
        if not request.url.path.startswith("/fake/") and held.fails(request.url.path):
            return error(f"Call to collective_rpc method failed: injected failure of {request.url.path}", 500)
        response: Response = await call_next(request)
        return response

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        cards = [{"id": str(held.model), "object": "model", "created": 0, "owned_by": "vllm",
                  "root": str(held.model), "parent": None}]
        cards += [{"id": name, "object": "model", "created": 0, "owned_by": "vllm", "root": path,
                   "parent": str(held.model), "max_model_len": None, "permission": []}
                  for name, (path, _) in held.adapters.items()]
        return {"object": "list", "data": cards}

    if os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "").lower() in ("1", "true"):
        add_lora_routes(app, held)

    @app.get("/weight_info")
    async def weight_info() -> dict[str, Any]:
        return {"weight_version": held.label}

    @app.get("/get_world_size")
    async def world_size(include_dp: bool = True) -> dict[str, Any]:
        return {"world_size": held.tp_size}

    @app.post("/pause")
    async def pause(mode: Literal["abort", "wait", "keep"] = "abort", clear_cache: bool = True) -> dict[str, Any]:
        held.paused = True
        return {"status": "paused"}

    @app.post("/resume")
    async def resume() -> dict[str, Any]:
        held.paused = False
        return {"status": "resumed"}

    @app.get("/is_paused")
    async def is_paused() -> dict[str, Any]:
        return {"is_paused": held.paused}

    @app.post("/sleep")
    async def sleep(level: Annotated[int, Query(ge=0, le=2)] = 1) -> dict[str, Any]:
        held.sleeping = True
        if level == 2:
            held.tensors = None  # discarded: a load must follow the wake
        return {"status": "sleeping", "level": level}

    @app.post("/wake_up")
    async def wake_up(tags: Annotated[list[str] | None, Query()] = None) -> dict[str, Any]:
        woken = set(tags or ["weights", "kv_cache"])
        session.setdefault("woken", set()).update(woken)
        if {"weights", "kv_cache"} <= session["woken"]:
            held.sleeping = False
            session["woken"] = set()
        return {"status": "sleeping" if held.sleeping else "awake", "tags": tags}

    @app.get("/is_sleeping")
    async def is_sleeping() -> dict[str, Any]:
        return {"is_sleeping": held.sleeping}

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache(reset_running_requests: bool = False) -> dict[str, Any]:
        return {"success": True}

    @app.post("/collective_rpc")
    async def collective_rpc(request: Request) -> Response:
        body = await request.json()
        if not isinstance(body, dict):
            return error("Request body must be a JSON object", 400)
        if "method" not in body:
            return error("Missing 'method' in request body", 400)
        if body["method"] != "reload_weights":
            return error(f"Call to collective_rpc method failed: no method {body['method']}", 500)
        path = Path((body.get("kwargs") or {}).get("weights_path") or held.model)
        try:
            held.tensors = await asyncio.to_thread(read_folder, path)
        except (OSError, ValueError) as exc:
            return error(f"Call to collective_rpc method failed: {exc}", 500)
        return JSONResponse({"results": [None] * held.tp_size})

    @app.post("/update_weight_version")
    async def update_weight_version(new_version: Annotated[str, Body(embed=True)]) -> dict[str, Any]:
        held.label = new_version
        return {"success": True, "new_version": new_version}

    @app.post("/init_weight_transfer_engine")
    async def init(init_info: Annotated[dict[str, Any], Body(embed=True)]) -> Response:
        missing = [k for k in INIT_KEYS if k not in init_info]
        if missing:
            return error(f"Call to collective_rpc method failed: Invalid init_info for NCCLWeightTransferEngine: "
                         f"missing {missing}", 500)
        group = TorchGroup(backend="gloo", address=init_info["master_address"], port=int(init_info["master_port"]),
                           rank=int(init_info["rank_offset"]), world_size=int(init_info["world_size"]),
                           name=vllm_gloo_name(int(init_info["master_port"])), timeout_s=60)
        try:
            await asyncio.to_thread(group.join)
        except RuntimeError as exc:
            return error(f"Call to collective_rpc method failed: {exc}", 500)
        session["group"] = group
        return JSONResponse({"message": "Weight transfer initialized"})

    @app.post("/shutdown_weight_transfer_engine")
    async def shutdown() -> Response:
        group, session["group"] = session["group"], None
        if group is not None:
            group.close()
        return JSONResponse({"message": "Weight transfer shut down"})

    @app.post("/start_weight_update")
    async def start() -> Response:
        if session["group"] is None:
            return error("Call to collective_rpc method failed: Weight transfer not configured. Please set "
                         "weight_transfer_config to enable weight transfer.", 500)
        if session["active"]:
            return error("Call to collective_rpc method failed: start_weight_update called while a weight update "
                         "is already active. Call finish_weight_update first.", 500)
        session["active"], session["pending"] = True, {}
        return JSONResponse({"message": "Weight update started"})

    @app.post("/update_weights")
    async def update_weights(update_info: Annotated[dict[str, Any], Body(embed=True)]) -> Response:
        if not session["active"]:
            return error("Call to collective_rpc method failed: start_weight_update must be called before "
                         "update_weights.", 500)
        try:
            received = await asyncio.to_thread(held.receive, session["group"], update_info.get("names", []),
                                               update_info.get("dtype_names", []), update_info.get("shapes", []))
        except (ValueError, RuntimeError) as exc:
            session["active"] = False  # a failure inside update_weights ends the session
            return error(f"Call to collective_rpc method failed: {exc}", 500)
        session["pending"].update(received)
        return JSONResponse({"message": "Weights updated"})

    @app.post("/finish_weight_update")
    async def finish(request: Request) -> Response:
        if not session["active"]:
            return error("Call to collective_rpc method failed: finish_weight_update called without a matching "
                         "start_weight_update.", 500)
        body = await request.json() if await request.body() else {}
        tensors: dict[str, torch.Tensor] = dict(held.tensors or {})
        tensors.update(session["pending"])
        held.tensors, session["active"] = tensors, False
        if body.get("weight_version") is not None:
            held.label = str(body["weight_version"])
        return JSONResponse({"message": "Weight update finished"})

    @app.get("/fake/state")
    async def state() -> dict[str, object]:
        return held.state()

    @app.post("/fake/fail")
    async def fail(path: Annotated[str, Body()], times: Annotated[int, Body()] = 1) -> dict[str, Any]:
        held.failing[path] = times
        return {"failing": held.failing}

    return app


class LoadLoRAAdapterRequest(BaseModel):
    lora_name: str
    lora_path: str
    load_inplace: bool = False
    is_3d_lora_weight: bool = False


class UnloadLoRAAdapterRequest(BaseModel):
    lora_name: str
    lora_int_id: int | None = None


def lora_error(message: str, status: int) -> JSONResponse:
    kind = {400: "InvalidUserInput", 404: "NotFoundError"}.get(status, "InternalServerError")
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": status}},
                        status_code=status)


def add_lora_routes(app: FastAPI, held: HeldWeights) -> None:
    @app.post("/v1/load_lora_adapter")
    async def load_lora(request: LoadLoRAAdapterRequest) -> Response:
        name = request.lora_name
        if not name or not request.lora_path:
            return lora_error("Both 'lora_name' and 'lora_path' must be provided.", 400)
        if name == str(held.model):
            return lora_error(f"The lora adapter '{name}' conflicts with a served base model.", 400)
        if name in held.adapters and not request.load_inplace:
            return lora_error(f"The lora adapter '{name}' has already been loaded. If you want to load the adapter "
                              "in place, set 'load_inplace' to True.", 400)
        try:
            loaded = await asyncio.to_thread(held.read_adapter, Path(request.lora_path))
        except FileNotFoundError:
            return lora_error(f"Loading lora {name} failed: No adapter found for {request.lora_path}", 404)
        held.adapters[name] = (request.lora_path, loaded)
        return Response(f"Success: LoRA adapter '{name}' added successfully.", status_code=200)

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora(request: UnloadLoRAAdapterRequest) -> Response:
        if held.adapters.pop(request.lora_name, None) is None:
            return lora_error(f"The lora adapter '{request.lora_name}' cannot be found.", 404)
        return Response(f"Success: LoRA adapter '{request.lora_name}' removed successfully.", status_code=200)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--completions", action="store_true", help='answer /v1/completions with "weights LABEL"')
    args = parser.parse_args()
    held = HeldWeights(args.model)
    app = create_app(held)
    if args.completions:
        def answer(body: dict[str, Any]) -> str:  # vLLM: an adapter is asked for by its name as the model
            model = str(body.get("model"))
            if model in held.adapters:
                return f"weights {held.label} adapter {model}"
            if model != str(held.model):
                raise LookupError(f"The model `{model}` does not exist.")
            return f"weights {held.label}"

        add_completions(app, str(args.model), lambda prompt: f"weights {held.label}", answer=answer)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
