"""The gateway's HTTP surface: harness APIs (bound to a rollout by path or token), rewards, admin, metrics."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import generate_latest
from pydantic import BaseModel, Field, ValidationError

from gateway import anthropic_messages, openai_chat, openai_completions
from gateway.control import ControlLoop
from gateway.engines import EnginePool
from gateway.errors import BodyTooLarge, Forbidden, GatewayError, InvalidRequest, Unauthorized
from gateway.gate import Gate
from gateway.metrics import Metrics
from gateway.recorder import Recorder
from gateway.render import Renderer
from gateway.rollouts import Rollouts
from gateway.service import Call, Gateway, Started
from gateway.settings import GatewaySettings
from gateway.tokenizer import ChatTokenizer
from gateway.tool_parsers import parser_for
from schemas.events import RewardReported, RolloutSealed
from schemas.producer import EventProducer
from schemas.rollout_token import verify

Handler = Callable[[Request, str | None], Awaitable[Response]]
Endpoint = Callable[[Request], Awaitable[Response]]


class Register(BaseModel):
    rollout_id: str = Field(min_length=1)
    run_id: str | None = None


class Reward(BaseModel):
    reward: float
    details: dict[str, Any] | None = None


class Pause(BaseModel):
    version: int = Field(ge=0)


def create_app(settings: GatewaySettings) -> FastAPI:
    metrics = Metrics()
    gate = Gate(settings.max_hold_s)
    rollouts = Rollouts()
    state: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        producer = EventProducer(settings.bus, client_id=f"gateway-{settings.gateway_id}")
        await producer.start()
        engines = EnginePool(settings.engines, retries=settings.engine_retries, timeout_s=settings.engine_timeout_s)
        tokenizer = await asyncio.to_thread(ChatTokenizer.load, settings.tokenizer)
        model = settings.model_name or await engines.model()
        gateway = Gateway(settings.gateway_id, model, Renderer(tokenizer), parser_for(settings.tool_parser), engines,
                          Recorder(producer), rollouts, gate, metrics)
        control = ControlLoop(settings.bus, settings.run_id, settings.gateway_id, settings.url, gate, producer,
                              metrics, on_version=gateway.set_version)
        task = asyncio.create_task(control.run())
        await asyncio.wait([task, asyncio.create_task(control.ready.wait())], return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            task.result()  # the control loop failed to start: fail the gateway's start with its error
        state.update(gateway=gateway, producer=producer, decode=lambda t: tokenizer.decode([t]))
        try:
            yield
        finally:
            await control.leave("shut down")
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            await engines.close()
            await producer.stop()

    app = FastAPI(title="Tether gateway", lifespan=lifespan)

    def gw() -> Gateway:
        gateway: Gateway = state["gateway"]
        return gateway

    # -- auth ------------------------------------------------------------------

    def api_key(request: Request) -> str | None:
        auth = request.headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            return auth[7:].strip()
        return request.headers.get("x-api-key")

    def bind(request: Request, path_rollout: str | None) -> str:
        """The rollout this call writes to; a token can only ever write to its own."""
        key = api_key(request)
        token_rollout = verify(key, settings.secret) if key else None
        if path_rollout is not None:
            if token_rollout is not None and token_rollout != path_rollout:
                raise Forbidden(f"this key belongs to another rollout, not {path_rollout!r}")
            if token_rollout is None and settings.path_binding_requires_token:
                raise Unauthorized("this gateway needs the rollout's token as the API key")
            return path_rollout
        if token_rollout is None:
            raise Unauthorized("use a rollout token as the API key, or a /rollouts/{id}/v1 base URL")
        return token_rollout

    def admin(request: Request) -> None:
        if not hmac.compare_digest((api_key(request) or "").encode(), settings.admin_key.encode()):
            raise Unauthorized("admin endpoints need the admin key")

    async def body_of(request: Request) -> tuple[str, dict[str, Any]]:
        """The body as the harness sent it (kept for the record) and parsed."""
        declared = int(request.headers.get("content-length") or 0)
        if declared > settings.max_body_bytes:
            raise BodyTooLarge(f"request body over {settings.max_body_bytes} bytes")
        parts, size = [], 0
        async for part in request.stream():  # a chunked upload is capped as it arrives, not after
            size += len(part)
            if size > settings.max_body_bytes:
                raise BodyTooLarge(f"request body over {settings.max_body_bytes} bytes")
            parts.append(part)
        try:
            raw = b"".join(parts).decode()
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
            raise InvalidRequest(f"malformed JSON body: {exc}") from exc
        if not isinstance(body, dict):
            raise InvalidRequest("the body must be a JSON object")
        return raw, body

    def parse(model: type[BaseModel], body: dict[str, Any]) -> Any:
        try:
            return model.model_validate(body)
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(p) for p in first["loc"]) or None
            message = "Unrecognized request argument supplied" if first["type"] == "extra_forbidden" \
                else first["msg"]
            raise InvalidRequest(f"{field}: {message}" if field else message, field) from exc

    # -- harness APIs ------------------------------------------------------------

    def protocol_errors(anthropic: bool) -> Callable[[Handler], Endpoint]:
        def wrap(handler: Handler) -> Endpoint:
            async def run(request: Request) -> Response:
                try:  # the rollout comes from the path only: never from a query string
                    return await handler(request, request.path_params.get("rollout_id"))
                except GatewayError as exc:
                    body = exc.anthropic_body() if anthropic else exc.openai_body()
                    return JSONResponse(body, status_code=exc.status, headers=exc.headers())
            return run
        return wrap

    async def serve(call: Call, stream: bool, sse: Callable[[Any], AsyncIterator[str]]) -> Response:
        if not stream:
            finished = await gw().complete(call)
            return Response(orjson.dumps(finished.response), media_type="application/json")
        items = gw().stream(call)
        first = await anext(items)  # binding, holding and rendering errors are still plain HTTP errors here
        assert isinstance(first, Started)

        async def replay() -> AsyncIterator[Any]:
            yield first
            async for item in items:
                yield item

        return StreamingResponse(sse(replay()), media_type="text/event-stream")

    def harness_api(api: str, request_model: type[BaseModel], responder: Callable[[Any], Any],
                    anthropic: bool) -> Endpoint:
        """One API a harness speaks: bind, parse in that protocol, serve through the common path."""

        @protocol_errors(anthropic)
        async def endpoint(request: Request, rollout_id: str | None) -> Response:
            rollout = bind(request, rollout_id)
            raw, body = await body_of(request)
            parsed = parse(request_model, body)
            answer = responder(parsed)
            return await serve(Call(rollout, api, raw, parsed.to_chat(), answer.body), parsed.stream, answer.sse)

        return endpoint

    chat = harness_api("openai.chat", openai_chat.ChatCompletionRequest,
                       lambda parsed: openai_chat.Responder(parsed, state["decode"]), anthropic=False)
    completions = harness_api("openai.completions", openai_completions.CompletionRequest,
                              lambda parsed: openai_completions.Responder(parsed, state["decode"]), anthropic=False)
    messages = harness_api("anthropic.messages", anthropic_messages.MessagesRequest,
                           anthropic_messages.Responder, anthropic=True)

    @protocol_errors(anthropic=False)
    async def models(request: Request, rollout_id: str | None) -> Response:
        bind(request, rollout_id)
        return JSONResponse({"object": "list", "data": [
            {"id": gw().model, "object": "model", "created": 0, "owned_by": "tether"}]})

    for prefix in ("", "/rollouts/{rollout_id}"):
        app.add_api_route(f"{prefix}/v1/chat/completions", chat, methods=["POST"])
        app.add_api_route(f"{prefix}/v1/completions", completions, methods=["POST"])
        app.add_api_route(f"{prefix}/v1/messages", messages, methods=["POST"])
        app.add_api_route(f"{prefix}/v1/models", models, methods=["GET"])

    @protocol_errors(anthropic=False)
    async def reward(request: Request, rollout_id: str | None) -> Response:
        assert rollout_id is not None
        key = api_key(request)
        if not key or verify(key, settings.secret) != rollout_id:
            raise Forbidden("a reward needs this rollout's token as the API key")
        parsed: Reward = parse(Reward, (await body_of(request))[1])
        rollout = gw().rollouts.get(rollout_id)
        if parsed.reward != parsed.reward or parsed.reward in (float("inf"), float("-inf")):
            raise InvalidRequest("reward must be a finite number", "reward")
        await gw().recorder.event(RewardReported(
            rollout_id=rollout_id, run_id=rollout.run_id, reward=parsed.reward, source="harness",
            details_json=json.dumps(parsed.details) if parsed.details is not None else None))
        return JSONResponse({"rollout_id": rollout_id, "reward": parsed.reward})

    app.add_api_route("/rollouts/{rollout_id}/reward", reward, methods=["POST"])

    # -- admin -------------------------------------------------------------------

    @protocol_errors(anthropic=False)
    async def register(request: Request, rollout_id: str | None) -> Response:
        admin(request)
        parsed: Register = parse(Register, (await body_of(request))[1])
        rollout = gw().rollouts.register(parsed.rollout_id, parsed.run_id or settings.run_id)
        return JSONResponse({"rollout_id": rollout.rollout_id, "run_id": rollout.run_id})

    @protocol_errors(anthropic=False)
    async def seal(request: Request, rollout_id: str | None) -> Response:
        admin(request)
        assert rollout_id is not None
        rollout = await gw().rollouts.seal(rollout_id)
        await gw().recorder.event(RolloutSealed(rollout_id=rollout_id, run_id=rollout.run_id,
                                                call_ids=list(rollout.acknowledged)))
        return JSONResponse({"rollout_id": rollout_id, "n_calls": len(rollout.acknowledged),
                             "call_ids": rollout.acknowledged})

    @protocol_errors(anthropic=False)
    async def admin_state(request: Request, rollout_id: str | None) -> Response:
        admin(request)
        return JSONResponse({
            "gateway_id": settings.gateway_id, "run_id": settings.run_id, "model": gw().model,
            "weight_version": gw().version, "paused": gate.paused, "paused_for": gate.paused_for,
            "in_flight": gate.in_flight, "held": gate.held, "rollouts": len(rollouts),
        })

    @protocol_errors(anthropic=False)
    async def pause(request: Request, rollout_id: str | None) -> Response:
        admin(request)
        parsed: Pause = parse(Pause, (await body_of(request))[1])
        gate.pause(parsed.version)
        await gate.drained()
        return JSONResponse({"paused": True, "in_flight": gate.in_flight, "held": gate.held})

    @protocol_errors(anthropic=False)
    async def resume(request: Request, rollout_id: str | None) -> Response:
        admin(request)
        gate.resume()
        return JSONResponse({"paused": False})

    app.add_api_route("/admin/rollouts", register, methods=["POST"])
    app.add_api_route("/admin/rollouts/{rollout_id}/seal", seal, methods=["POST"])
    app.add_api_route("/admin/state", admin_state, methods=["GET"])
    app.add_api_route("/admin/pause", pause, methods=["POST"])
    app.add_api_route("/admin/resume", resume, methods=["POST"])

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "gateway_id": settings.gateway_id}

    @app.get("/metrics")
    async def prometheus() -> Response:
        metrics.held.set(gate.held)
        metrics.in_flight.set(gate.in_flight)
        return Response(generate_latest(metrics.registry), media_type="text/plain; version=0.0.4")

    return app
