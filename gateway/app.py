"""The gateway's HTTP app: its routers (harness APIs, rollouts, admin, health and metrics) around one `Gateway`.

The service is built in the app's lifespan and published to the routes (in
`app.state`) only once the control loop has read the run's control history
and joined: the gateway starts at the current weight version, paused if an
update is under way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from gateway.api.harness import harness_router
from gateway.company import Company
from gateway.control import ControlLoop
from gateway.gate import Gate
from gateway.metrics import Metrics
from gateway.own_writes import OwnWrites
from gateway.peers import PeerWatch
from gateway.readback import RolloutReader
from gateway.recorder import Recorder
from gateway.render import Renderer
from gateway.rollouts import Rollouts
from gateway.routes import admin, ops, rollouts
from gateway.service import Gateway
from gateway.settings import GatewaySettings
from gateway.tokenizer import ChatTokenizer
from gateway.tool_parsers import parser_for
from gateway.upstream import EnginePool
from schemas.heap import settle
from schemas.producer import EventProducer

log = logging.getLogger("tether.gateway")
RESTORE_WINDOW_S = 6 * 3600.0  # how far back a rollout this process does not hold is looked for in the log


def create_app(settings: GatewaySettings) -> FastAPI:
    app = FastAPI(title="Tether gateway", lifespan=_lifespan)
    app.state.settings = settings
    app.include_router(harness_router)
    app.include_router(harness_router, prefix="/rollouts/{rollout_id}")
    for router in (rollouts.router, admin.router, ops.router):
        app.include_router(router)
    return app


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings: GatewaySettings = app.state.settings
    started = time.perf_counter()
    producer = EventProducer(settings.bus, client_id=f"gateway-{settings.gateway_id}")
    engines = EnginePool(settings.engines, retries=settings.engine_retries, timeout_s=settings.engine_timeout_s,
                         api_key=settings.engine_api_key, hold_s=settings.max_hold_s)
    # Independent waits, at once: a restarted gateway's calls queue until it serves (infra/supervisor.py).
    try:
        tokenizer, model, _ = await asyncio.gather(asyncio.to_thread(ChatTokenizer.load, settings.tokenizer,
                                                                     settings.token_cache_tokens),
                                                   _model_name(settings, engines), producer.start())
    except BaseException:
        await engines.close()
        await producer.stop()
        raise
    prepared = time.perf_counter()
    metrics, gate = Metrics(), Gate(settings.max_hold_s)
    own = OwnWrites()
    history = RolloutReader(settings.bus, producer, window_s=RESTORE_WINDOW_S,
                            name=f"gateway-{settings.gateway_id}-history", tips=settings.extendable_calls)
    gateway = Gateway(gateway_id=settings.gateway_id, model=model, renderer=Renderer(tokenizer),
                      parser=parser_for(settings.tool_parser), engines=engines,
                      recorder=Recorder(producer, own), rollouts=Rollouts(max_tips=settings.extendable_calls),
                      gate=gate, metrics=metrics, history=history, resume_rendering=settings.resume_rendering,
                      render_check_every=settings.render_check_every, engine_kind=settings.engine_kind)
    company = Company(settings.gateway_id, settings.peer_lease_s)
    control = ControlLoop(bus=settings.bus, run_id=settings.run_id, gateway_id=settings.gateway_id,
                          url=settings.url, gate=gate, producer=producer, metrics=metrics,
                          on_version=gateway.set_version, heartbeat_s=settings.heartbeat_s, company=company)
    peers = PeerWatch(bus=settings.bus, gateway_id=settings.gateway_id, rollouts=gateway.rollouts, own=own,
                      producer=producer, metrics=metrics, company=company)
    tasks = [asyncio.create_task(peers.run()), asyncio.create_task(control.run())]
    if settings.engine_check_s > 0:
        tasks.append(asyncio.create_task(engines.watch(settings.engine_kind, lambda: gateway.version,
                                                       settings.engine_check_s)))
    await _started(tasks, [peers.ready, control.ready])
    app.state.gateway = gateway
    log.info("gateway %s starts serving: tokenizer, Kafka producer and engine %.2f s, then the control and peer "
             "logs read %.2f s", settings.gateway_id, prepared - started, time.perf_counter() - prepared)
    settle()  # the tokenizer and the libraries live as long as the process (schemas.heap)
    try:
        yield
    finally:
        await control.leave("shut down")
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await engines.close()
        await producer.stop()




async def _model_name(settings: GatewaySettings, engines: EnginePool) -> str:
    return settings.model_name or await engines.model()


async def _started(tasks: list[asyncio.Task[None]], ready: list[asyncio.Event]) -> None:
    """Until every loop is ready; a loop that fails first fails the gateway's start with its error."""
    all_ready: asyncio.Future[Any] = asyncio.ensure_future(asyncio.gather(*(e.wait() for e in ready)))
    watched: set[asyncio.Future[Any]] = {all_ready, *tasks}
    done, _ = await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
    for task in tasks:
        if task in done:
            all_ready.cancel()
            task.result()  # raises the loop's error
            raise RuntimeError("a gateway loop ended before the gateway started")
