"""`tether view`'s process: the run's topics projected into the store, and the pages served over it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from analytics.errors import AnalyticsError
from analytics.view.pages import router
from analytics.view.reads import Decoder, RunReads
from analytics.view.settings import ViewSettings
from analytics.view.store import ViewStore
from analytics.view.tokens import token_texts
from schemas import topics
from schemas.consumer import CaughtUp, EventConsumer
from schemas.errors import AccessDenied, BusError
from schemas.producer import EventProducer
from schemas.settings import BusSettings

log = logging.getLogger("tether.view")
TOPICS = (topics.CALLS, topics.ROLLOUTS, topics.SAMPLES, topics.CONTROL)


async def project(store: ViewStore, bus: BusSettings, run_id: str | None, follow: bool,
                  caught_up: asyncio.Event) -> None:
    """The topics into the store, from where it last read them (the start, the first time); then, following,
    what arrives (a refresh shows it)."""
    async with EventProducer(bus, client_id="tether-view") as dlq, \
            EventConsumer(bus, TOPICS, dlq, name="tether-view") as consumer:
        stored = await asyncio.to_thread(store.positions, run_id)
        ends = await consumer.end_offsets()
        for tp, end in ends.items():
            place = stored.get((tp.topic, tp.partition))
            if place is not None and place <= end:
                consumer.seek(tp, place)
            elif place is not None:  # the topic was made anew: what the store read is not this log
                log.warning("%s[%d]: the store read to %d, past its end %d; reading it from the start", tp.topic,
                            tp.partition, place, end)
        if stored:
            log.info("reading on from where the store left off (%d records in)", sum(stored.values()))
        async for item in consumer.follow_batches(timeout_ms=500):
            if isinstance(item, CaughtUp):
                caught_up.set()
                log.info("the store holds everything the topics held at start")
                if not follow:
                    return
            elif item:
                read_to = {(tp.topic, tp.partition): await consumer.position(tp) for tp in consumer.assignment()}
                await asyncio.to_thread(store.add, [r.event for r in item], run_id, read_to)


async def keep_projecting(store: ViewStore, bus: BusSettings, settings: ViewSettings, caught_up: asyncio.Event,
                          retry_s: float = 5.0) -> None:
    """`project`, again after Kafka went away or refused (the store keeps every row once: nothing doubles).
    Access refused is said once and ends it: retrying would not change the ACLs."""
    while True:
        try:
            await project(store, bus, settings.run_id, settings.follow, caught_up)
            return
        except AccessDenied as exc:
            log.error("reading the topics: %s", exc)
            return
        except (BusError, AnalyticsError, OSError) as exc:
            log.warning("reading the topics failed (%s); trying again in %.0f s", exc, retry_s)
            await asyncio.sleep(retry_s)


def decoder(model: Path | None) -> Decoder | None:
    """Each response token as text, by the model's tokenizer."""
    if model is None:
        return None
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)

    def decode(token_ids: list[int]) -> list[str]:
        return token_texts(token_ids, lambda ids: str(tokenizer.decode(ids)))

    return decode


def create_app(settings: ViewSettings, bus: BusSettings) -> FastAPI:
    store = ViewStore(settings.store)
    reads = RunReads(store, decoder(settings.model))
    caught_up = asyncio.Event()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        task = asyncio.create_task(keep_projecting(store, bus, settings, caught_up))

        def stopped(t: asyncio.Task[None]) -> None:
            if not t.cancelled() and t.exception() is not None:
                log.error("reading the topics stopped: %r", t.exception())

        task.add_done_callback(stopped)
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    app = FastAPI(title="Tether view", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.mount("/static", StaticFiles(directory=Path(__file__).parent / "static"), name="static")
    app.include_router(router(reads))

    @app.get("/health")
    def health() -> dict[str, bool]:
        return {"caught_up": caught_up.is_set()}

    return app
