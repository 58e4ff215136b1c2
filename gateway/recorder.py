"""Every call's ModelCall on tether.calls, acknowledged before the harness gets its answer."""

from __future__ import annotations

from gateway.errors import InvalidRequest, RecordingFailed
from gateway.own_writes import OwnWrites
from schemas.errors import BusError, EncodeError
from schemas.events import ModelCall, RewardReported, RolloutSealed
from schemas.producer import EventProducer


class Recorder:
    def __init__(self, producer: EventProducer, own: OwnWrites | None = None) -> None:
        self._producer = producer
        self._own = own or OwnWrites()

    async def calls(self, calls: list[ModelCall]) -> None:
        """All the call's events (one per choice) acknowledged, or RecordingFailed: then nothing counts."""
        try:
            for delivery in await self._producer.publish_many(calls):
                self._own.add(delivery.partition, delivery.offset)
        except EncodeError as exc:  # e.g. a lone UTF-16 surrogate in the request: not storable, not served
            raise InvalidRequest(f"the call cannot be recorded as sent: {exc}") from exc
        except BusError as exc:
            raise RecordingFailed(f"the call could not be recorded ({exc}); it was not served",
                                  retry_after_s=5) from exc

    async def event(self, event: RolloutSealed | RewardReported) -> None:
        try:
            await self._producer.publish(event)
        except BusError as exc:
            raise RecordingFailed(f"could not record {type(event).__name__}: {exc}", retry_after_s=5) from exc
