"""Publishing events: idempotent, acks=all, and an error instead of success when Kafka did not store it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from schemas.access import authorization_error, refusal
from schemas.errors import DeliveryError
from schemas.events import Event, run_of
from schemas.lifecycle import Lifecycle
from schemas.security import client_kwargs
from schemas.serde import encode
from schemas.settings import BusSettings
from schemas.topics import RUN_HEADER, key_for, topic_for


@dataclass(frozen=True)
class Delivery:
    """Where Kafka stored an event."""

    topic: str
    partition: int
    offset: int


def run_headers(event: Event) -> list[tuple[str, bytes]] | None:
    run = run_of(event)
    return None if run is None else [(RUN_HEADER, run.encode())]


class EventProducer(Lifecycle):
    """One idempotent producer per process; `publish` returns only once the event is acknowledged."""

    def __init__(self, settings: BusSettings, client_id: str | None = None) -> None:
        self._settings = settings
        self._client_id = client_id or settings.client_id
        self._producer = AIOKafkaProducer(
            bootstrap_servers=settings.bootstrap_servers,
            client_id=self._client_id,
            acks="all",
            enable_idempotence=True,
            linger_ms=settings.linger_ms,
            compression_type=settings.compression_type,
            max_request_size=settings.max_request_bytes,
            request_timeout_ms=settings.request_timeout_ms,
            **client_kwargs(settings),
        )

    async def start(self) -> None:
        try:
            await self._producer.start()
        except KafkaError as exc:
            await self.stop()
            denied = await refusal(exc, self._settings, self._client_id, "connect")
            raise denied or DeliveryError(f"cannot reach Kafka at {self._settings.bootstrap_servers}: {exc!r}") from exc

    async def stop(self, timeout_s: float = 10.0) -> None:
        """Flush and close; bounded, because an idempotent producer would wait for an absent broker forever."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._producer.stop(), timeout_s)

    async def publish(self, event: Event) -> Delivery:
        """Encode, send, and wait for the acknowledgement of all in-sync replicas."""
        (delivery,) = await self.publish_many([event])
        return delivery

    async def publish_many(self, batch: Sequence[Event]) -> list[Delivery]:
        """Send all, then wait for every acknowledgement. Not atomic: on DeliveryError some may be stored. Each
        record carries its run in a header (`topics.RUN_HEADER`), so a reader of one run passes over the others'
        without decoding them."""
        return await self.send_many([(topic_for(e).name, key_for(e), encode(e)) for e in batch],
                                    [run_headers(e) for e in batch])

    async def send_many(self, records: Sequence[tuple[str, bytes | None, bytes]],
                        headers: Sequence[list[tuple[str, bytes]] | None] | None = None) -> list[Delivery]:
        # aiokafka retries an idempotent batch until the broker takes it (never
        # expiring it), so a broker restart delays acks without duplicating
        # events; our own deadline only bounds how long the caller waits.
        try:
            async with asyncio.timeout(self._settings.delivery_timeout_s):
                pending = [await self._producer.send(topic, value, key=key, headers=h)
                           for (topic, key, value), h in zip(records, headers or [None] * len(records), strict=True)]
                metas = await asyncio.gather(*pending)
        except (KafkaError, TimeoutError) as exc:
            denied = authorization_error(exc, self._settings, self._client_id, "write to")
            raise denied or DeliveryError(f"{len(records)} event(s) not acknowledged: {exc!r}") from exc
        return [Delivery(m.topic, m.partition, m.offset) for m in metas]
