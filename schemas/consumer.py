"""Reading events: decoded records in, rejected records out to tether.deadletter, never a crash loop.

Which records are rejected is `schemas.deadletters.accept`'s decision. A
rejected record is published to tether.deadletter, and acknowledged there,
before the consumer moves past it. If that publish fails, the consumer seeks
back so that nothing unhandled is skipped, and the error reaches the caller.

Every service reads the log through one projection: `read_to_end` for what a
topic holds now (replay, `rollouts ls`, a run's task groups), `follow` for a
reader that rebuilds its state and then keeps up (gateway, controller,
trainer), marking the moment it has caught up with `CAUGHT_UP`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeAlias

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.errors import KafkaError

from schemas.access import authorization_error, refusal
from schemas.deadletters import Rejection, accept
from schemas.errors import BusError, DeliveryError, ReadError
from schemas.events import Event
from schemas.lifecycle import Lifecycle
from schemas.producer import Delivery
from schemas.security import client_kwargs
from schemas.settings import BusSettings
from schemas.topics import Topic

Record: TypeAlias = ConsumerRecord[bytes, bytes]


class DeadLetterSink(Protocol):
    """Where rejected records go: an EventProducer in production."""

    async def publish(self, event: Event) -> Delivery: ...


@dataclass(frozen=True)
class Received:
    event: Event
    topic: str
    partition: int
    offset: int
    key: bytes | None


@dataclass(frozen=True, slots=True)
class CaughtUp:
    """Yielded once by `follow`: every record on the topics when reading began has been yielded before it."""


CAUGHT_UP = CaughtUp()
Progress: TypeAlias = Callable[[int, int], None]  # (records read, records to read) until caught up
Wanted: TypeAlias = Callable[[Record], bool]  # which records a reader decodes (by key, partition, offset)


class EventConsumer(Lifecycle):
    """Async iterator of `Received` events over some topics of the catalogue."""

    def __init__(
        self,
        settings: BusSettings,
        topics: Sequence[Topic],
        deadletters: DeadLetterSink,
        *,
        group_id: str | None = None,
        from_beginning: bool = True,
        name: str | None = None,
    ) -> None:
        self._deadletters = deadletters
        self._settings = settings
        self._name = name or group_id or settings.client_id
        self._consumer = AIOKafkaConsumer(
            *[t.name for t in topics],
            bootstrap_servers=settings.bootstrap_servers,
            client_id=settings.client_id,
            group_id=group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest" if from_beginning else "latest",
            isolation_level="read_committed",
            max_partition_fetch_bytes=settings.max_partition_fetch_bytes,
            fetch_max_bytes=max(settings.max_request_bytes, 8 * settings.max_partition_fetch_bytes),
            request_timeout_ms=max(settings.request_timeout_ms, 40_000),
            **client_kwargs(settings),
        )
        self.dead_lettered = 0

    async def start(self) -> None:
        try:
            await self._consumer.start()
        except KafkaError as exc:
            await self._consumer.stop()
            denied = await refusal(exc, self._settings, self._name, "read")
            raise denied or DeliveryError(f"consumer cannot reach Kafka: {exc!r}") from exc

    async def stop(self, timeout_s: float = 5.0) -> None:
        """Bounded: under uvloop, closing a TLS connection waits up to 30 s for a close_notify the brokers do not
        send (a gateway's stop on a secured cluster took that long)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._consumer.stop(), timeout_s)

    async def commit(self) -> None:
        """Commit the positions past everything yielded so far (group consumers only)."""
        await self._consumer.commit()

    async def end_offsets(self) -> dict[TopicPartition, int]:
        """Current end of every assigned partition: where a reader that wants 'everything so far' stops."""
        try:
            return dict(await self._consumer.end_offsets(list(self._consumer.assignment())))
        except KafkaError as exc:
            raise self._fetch_error(exc) from exc

    def assignment(self) -> set[TopicPartition]:
        return set(self._consumer.assignment())

    def assign(self, partitions: Sequence[TopicPartition]) -> None:
        """Read exactly these partitions (on a consumer made with no topics): one key's history, say."""
        self._consumer.assign(list(partitions))

    async def seek_to_time(self, partition: TopicPartition, timestamp_ms: int) -> None:
        """Read `partition` from its first record stamped at or after `timestamp_ms` (its end if none is)."""
        found = (await self._consumer.offsets_for_times({partition: timestamp_ms})).get(partition)
        if found is not None:
            self._consumer.seek(partition, found.offset)
        else:
            self._consumer.seek(partition, (await self._consumer.end_offsets([partition]))[partition])

    def pause(self) -> None:
        """Fetch nothing more from the assigned partitions (a reader with nothing to read for a while); the
        position is kept, so `resume` goes on from it (or from a seek)."""
        self._consumer.pause(*self._consumer.assignment())

    def resume(self) -> None:
        self._consumer.resume(*self._consumer.assignment())

    def seek(self, partition: TopicPartition, offset: int) -> None:
        """Read `partition` from `offset` next (a reader that keeps its own offsets, e.g. in a checkpoint)."""
        self._consumer.seek(partition, offset)

    async def position(self, partition: TopicPartition) -> int:
        """Offset of the next record this consumer will read from `partition`."""
        return int(await self._consumer.position(partition))

    def _fetch_error(self, exc: KafkaError) -> BusError:
        """aiokafka's error as ours, translated here once: readers catch BusError, never aiokafka's errors."""
        denied = authorization_error(exc, self._settings, self._name, "read")
        return denied or ReadError(f"{self._name}: fetching from Kafka failed: {exc!r}")

    async def __aiter__(self) -> AsyncIterator[Received]:
        records = aiter(self._consumer)
        while True:
            try:
                record = await anext(records)
            except StopAsyncIteration:
                return
            except KafkaError as exc:  # authorization or an offset out of range, which aiokafka raises here
                raise self._fetch_error(exc) from exc
            try:
                received = await self._accept(record)
            except BaseException:
                self._consumer.seek(TopicPartition(record.topic, record.partition), record.offset)
                raise
            if received is not None:
                yield received

    async def batches(self, timeout_ms: int = 1000, max_records: int | None = None,
                      wanted: Wanted | None = None) -> AsyncIterator[list[Received]]:
        """Like iteration, but a batch per fetch (possibly empty), so callers can stop on idleness. Records whose
        `wanted` refuses are passed over undecoded (a reader that wants them all judges them)."""
        while True:
            try:
                fetched = await self._consumer.getmany(timeout_ms=timeout_ms, max_records=max_records)
            except KafkaError as exc:
                raise self._fetch_error(exc) from exc
            batch: list[Received] = []
            try:
                for records in fetched.values():
                    for record in records:
                        if wanted is not None and not wanted(record):
                            continue
                        received = await self._accept(record)
                        if received is not None:
                            batch.append(received)
            except BaseException:
                # Nothing of this fetch reached the caller: rewind so all of it is read again.
                for tp, records in fetched.items():
                    self._consumer.seek(tp, records[0].offset)
                raise
            yield batch

    async def follow(self, timeout_ms: int = 200, progress: Progress | None = None, wanted: Wanted | None = None
                     ) -> AsyncIterator[Received | CaughtUp]:
        """Every event from the current position on, for ever, with `CAUGHT_UP` once after the last record that
        the topics held when it began (at once if they held none): the projection of a reader that rebuilds its
        state from the log and then keeps it current."""
        async for item in self.follow_batches(timeout_ms, progress, wanted):
            if isinstance(item, CaughtUp):
                yield item
            else:
                for received in item:
                    yield received

    async def follow_batches(self, timeout_ms: int = 200, progress: Progress | None = None,
                             wanted: Wanted | None = None) -> AsyncIterator[list[Received] | CaughtUp]:
        """`follow`, a fetch at a time (possibly empty): for a projection that writes in batches."""
        ends = await self.end_offsets()
        total = sum(ends.values())
        caught_up = await self._reached(ends, total, progress)
        if caught_up:
            yield CAUGHT_UP
        async for batch in self.batches(timeout_ms=timeout_ms, wanted=wanted):
            yield batch
            if not caught_up and await self._reached(ends, total, progress):
                caught_up = True
                yield CAUGHT_UP

    async def read_to_end(self, timeout_ms: int = 200, progress: Progress | None = None,
                          wanted: Wanted | None = None) -> AsyncIterator[Received]:
        """Every event on the topics now, from the current position, then stop."""
        async for item in self.follow(timeout_ms, progress, wanted):
            if isinstance(item, CaughtUp):
                return
            yield item

    async def _reached(self, ends: dict[TopicPartition, int], total: int, progress: Progress | None) -> bool:
        positions = [min(await self.position(tp), end) for tp, end in ends.items()]
        if progress is not None:
            progress(sum(positions), total)
        return all(p >= end for p, end in zip(positions, ends.values(), strict=True))

    async def _accept(self, record: Record) -> Received | None:
        decided = accept(record.value, record.topic)
        if isinstance(decided, Rejection):
            await self._deadletters.publish(decided.letter(
                topic=record.topic, partition=record.partition, offset=record.offset, key=record.key,
                value=record.value, consumer=self._name))
            self.dead_lettered += 1
            return None
        return Received(decided, record.topic, record.partition, record.offset, record.key)
