"""HTTP surface of the engine: vLLM-compatible completions, models, health, and weight management."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, Field

from engine.engine import Engine
from engine.errors import EngineError, ModelNotFound
from engine.protocol import Choice, CompletionRequest, Responder, error_body
from engine.sequences import Chunk
from schemas.validation import first_error


class LoadWeights(BaseModel):
    path: str
    version: int = Field(ge=0)


class SetVersion(BaseModel):
    version: int = Field(ge=0)


def create_app(engine: Engine, model_name: str, max_logprobs: int = 20, own_engine: bool = True,
               default_max_tokens: int | None = None) -> FastAPI:
    """The app serves `engine` under `model_name`; with own_engine the app starts and stops it."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if own_engine:
            engine.start()
        try:
            yield
        finally:
            if own_engine:
                engine.stop()

    app = FastAPI(title="Tether engine", lifespan=lifespan)
    tokenizer = engine.tokenizer

    def encode(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode_one(token_id: int) -> str:
        return str(tokenizer.decode([token_id]))

    @app.exception_handler(EngineError)
    async def engine_error(_: Request, exc: EngineError) -> JSONResponse:
        return JSONResponse(error_body(exc.message, exc.type, exc.status, exc.param), status_code=exc.status)

    app.exception_handler(RequestValidationError)(_invalid)
    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "weight_version": engine.version, "paused": engine.paused,
                "deterministic": engine.deterministic, "busy_s": round(engine.busy_s, 6), "prefix_cache": {
                    "entries": len(engine.prefixes), "bytes": engine.prefixes.bytes, "hits": engine.prefixes.hits,
                    "reused_tokens": engine.prefixes.reused_tokens}}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{
            "id": model_name, "object": "model", "created": 0, "owned_by": "tether", "root": model_name,
            "max_model_len": engine.max_model_len,
        }]}

    @app.get("/v1/weights")
    async def weights() -> dict[str, Any]:
        return {"version": engine.version, "paused": engine.paused}

    @app.post("/v1/weights/load")
    async def load_weights(body: LoadWeights) -> dict[str, Any]:
        await engine.load_checkpoint(body.path, body.version)
        return {"version": engine.version}

    @app.post("/v1/weights/version")
    async def set_version(body: SetVersion) -> dict[str, Any]:
        async with engine.exclusive(body.version):
            pass
        return {"version": engine.version}

    # vLLM's RL routes, in its wire format, for the trainer's hand-over (`trainer/engines/tether.py`)
    @app.post("/pause")
    async def pause(mode: Literal["wait"] = "wait") -> dict[str, Any]:
        """vLLM's default mode is abort; this engine finishes what runs (wait), the only mode it offers."""
        await engine.pause()
        return {"status": "paused"}

    @app.post("/resume")
    async def resume() -> dict[str, Any]:
        engine.resume()
        return {"status": "resumed"}

    @app.get("/is_paused")
    async def is_paused() -> dict[str, Any]:
        return {"is_paused": engine.paused}

    @app.post("/sleep")
    async def sleep(level: Annotated[int, Query(ge=1, le=2)] = 1) -> dict[str, Any]:
        """Either level keeps the weights in host memory (a checkpoint load replaces them anyway)."""
        await engine.sleep()
        return {"status": "sleeping", "level": level}

    @app.post("/wake_up")
    async def wake_up(tags: Annotated[list[Literal["weights", "kv_cache"]] | None, Query()] = None
                      ) -> dict[str, Any]:
        """Any tag wakes it whole: its KV cache is allocated per batch, not reserved."""
        await engine.wake()
        return {"status": "awake", "tags": tags}

    @app.get("/is_sleeping")
    async def is_sleeping() -> dict[str, Any]:
        return {"is_sleeping": engine.asleep}

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache() -> dict[str, Any]:
        await engine.reset_prefix_cache()
        return {"success": True}

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest) -> JSONResponse | StreamingResponse:
        if body.model != model_name:
            raise ModelNotFound(f"The model `{body.model}` does not exist.", "model")
        prompt_ids = body.prompt_ids(encode)
        request = body.to_engine(prompt_ids, max_logprobs, engine.max_model_len, default_max_tokens)
        engine.check(request)
        responder = Responder(body, model_name, prompt_ids, decode_one)
        chunks = engine.generate(request)
        if body.stream:
            return StreamingResponse(_stream(responder, chunks, body), media_type="text/event-stream")
        choices = {i: Choice(i) for i in range(request.n)}
        async for chunk in chunks:
            responder.version = chunk.version
            choices[chunk.index].add(chunk, responder.name)
        return JSONResponse(responder.body(list(choices.values())),
                            headers={"x-tether-weight-version": str(responder.version)})

    return app


async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
    """A bad request as the OpenAI error body: the first problem, named by its field."""
    errors = exc.errors()
    first = first_error(errors, skip=("body",))
    field = first.field
    if first.type == "json_invalid":
        ctx = errors[0].get("ctx")
        reason = ctx.get("error", first.message) if isinstance(ctx, dict) else first.message
        message, field = f"malformed JSON body: {reason}", None
    else:
        message = first.line() if errors else "invalid request"
    return JSONResponse(error_body(message, "BadRequestError", 400, field), status_code=400)


async def _stream(responder: Responder, chunks: AsyncIterator[Chunk], body: CompletionRequest
                  ) -> AsyncIterator[str]:
    started: set[int] = set()
    try:
        async for chunk in chunks:
            responder.version = chunk.version
            yield f"data: {json.dumps(responder.chunk(chunk, chunk.index not in started))}\n\n"
            started.add(chunk.index)
    except EngineError as exc:
        yield f"data: {json.dumps(error_body(exc.message, exc.type, exc.status, exc.param))}\n\n"
        return
    if body.stream_options is not None and body.stream_options.include_usage:
        yield f"data: {json.dumps(responder.usage_chunk())}\n\n"
    yield "data: [DONE]\n\n"
