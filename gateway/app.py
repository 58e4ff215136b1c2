"""The gateway's HTTP app: its routers (harness APIs, rollouts, admin, health and metrics) around one `Gateway`.

The service is built in the app's lifespan and published to the routes (in
`app.state`) only once the control loop has read the run's control history
and joined: the gateway starts at the current weight version, paused if an
update is under way.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from gateway.control import ControlLoop
from gateway.engines import EnginePool
from gateway.gate import Gate
from gateway.history import RolloutHistory
from gateway.metrics import Metrics
from gateway.recorder import Recorder
from gateway.render import Renderer
from gateway.rollouts import Rollouts
from gateway.routes import admin, harness, ops, rollouts
from gateway.service import Gateway
from gateway.settings import GatewaySettings
from gateway.tokenizer import ChatTokenizer
from gateway.tool_parsers import parser_for
from schemas.producer import EventProducer

RESTORE_WINDOW_S = 6 * 3600.0  # how far back a rollout this process does not hold is looked for in the log


def create_app(settings: GatewaySettings) -> FastAPI:
    app = FastAPI(title="Tether gateway", lifespan=_lifespan)
    app.state.settings = settings
    app.include_router(harness.router)
    app.include_router(harness.router, prefix="/rollouts/{rollout_id}")
    for router in (rollouts.router, admin.router, ops.router):
        app.include_router(router)
    return app


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings: GatewaySettings = app.state.settings
    producer = EventProducer(settings.bus, client_id=f"gateway-{settings.gateway_id}")
    await producer.start()
    engines = EnginePool(settings.engines, retries=settings.engine_retries, timeout_s=settings.engine_timeout_s)
    tokenizer = await asyncio.to_thread(ChatTokenizer.load, settings.tokenizer)
    metrics, gate = Metrics(), Gate(settings.max_hold_s)
    history = RolloutHistory(settings.bus, producer, window_s=RESTORE_WINDOW_S,
                             name=f"gateway-{settings.gateway_id}-history")
    gateway = Gateway(gateway_id=settings.gateway_id, model=settings.model_name or await engines.model(),
                      renderer=Renderer(tokenizer), parser=parser_for(settings.tool_parser), engines=engines,
                      recorder=Recorder(producer), rollouts=Rollouts(), gate=gate, metrics=metrics,
                      history=history)
    control = ControlLoop(bus=settings.bus, run_id=settings.run_id, gateway_id=settings.gateway_id,
                          url=settings.url, gate=gate, producer=producer, metrics=metrics,
                          on_version=gateway.set_version)
    task = asyncio.create_task(control.run())
    await asyncio.wait([task, asyncio.create_task(control.ready.wait())], return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        task.result()  # the control loop failed to start: fail the gateway's start with its error
    app.state.gateway = gateway
    try:
        yield
    finally:
        await control.leave("shut down")
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        await engines.close()
        await producer.stop()
