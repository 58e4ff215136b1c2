"""Reading events: decoded records in, bad bytes out to tether.deadletter, never a crash loop."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from types import TracebackType

from aiokafka import AIOKafkaConsumer, ConsumerRecord
from aiokafka.errors import KafkaError

from schemas.errors import DecodeError, DeliveryError
from schemas.events import DeadLetter, Event
from schemas.producer import EventProducer
from schemas.serde import decode
from schemas.settings import BusSettings
from schemas.topics import Topic


@dataclass(frozen=True)
class Received:
    event: Event
    topic: str
    partition: int
    offset: int
    key: bytes | None


class EventConsumer:
    """Async iterator of `Received` events over some topics of the catalogue.

    A record that does not decode is published to tether.deadletter (and
    acknowledged there) before the consumer moves past it.
    """

    def __init__(
        self,
        settings: BusSettings,
        topics: Sequence[Topic],
        deadletters: EventProducer,
        group_id: str | None = None,
        from_beginning: bool = True,
        name: str | None = None,
    ) -> None:
        self._deadletters = deadletters
        self._name = name or group_id or settings.client_id
        self._consumer = AIOKafkaConsumer(
            *[t.name for t in topics],
            bootstrap_servers=settings.bootstrap_servers,
            client_id=settings.client_id,
            group_id=group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest" if from_beginning else "latest",
            isolation_level="read_committed",
            max_partition_fetch_bytes=settings.max_message_bytes,
            fetch_max_bytes=4 * settings.max_message_bytes,
            request_timeout_ms=max(settings.request_timeout_ms, 40_000),
        )
        self.dead_lettered = 0

    async def start(self) -> None:
        try:
            await self._consumer.start()
        except KafkaError as exc:
            raise DeliveryError(f"consumer cannot reach Kafka: {exc!r}") from exc

    async def stop(self) -> None:
        await self._consumer.stop()

    async def __aenter__(self) -> EventConsumer:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def commit(self) -> None:
        await self._consumer.commit()

    async def __aiter__(self) -> AsyncIterator[Received]:
        async for record in self._consumer:
            received = await self._accept(record)
            if received is not None:
                yield received

    async def batches(self, timeout_ms: int = 1000, max_records: int | None = None) -> AsyncIterator[list[Received]]:
        """Like iteration, but a batch per fetch (possibly empty), so callers can stop on idleness."""
        while True:
            fetched = await self._consumer.getmany(timeout_ms=timeout_ms, max_records=max_records)
            batch = []
            for records in fetched.values():
                for record in records:
                    received = await self._accept(record)
                    if received is not None:
                        batch.append(received)
            yield batch

    async def _accept(self, record: ConsumerRecord[bytes, bytes]) -> Received | None:
        try:
            event = decode(record.value or b"")
        except DecodeError as exc:
            await self._deadletters.publish(
                DeadLetter(
                    topic=record.topic,
                    partition=record.partition,
                    offset=record.offset,
                    key=record.key,
                    value=record.value,
                    reason=str(exc),
                    error_type=type(exc).__name__,
                    consumer=self._name,
                )
            )
            self.dead_lettered += 1
            return None
        return Received(event, record.topic, record.partition, record.offset, record.key)
