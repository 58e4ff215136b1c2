"""Which records a reader rejects, and the dead letter that says why: one decision for every consumer.

A record is rejected when its bytes do not decode, or when it decodes to an
event that does not belong on its topic. `EventConsumer` and the Faust
processors both classify through `accept`, so a record is judged the same
wherever it is read.
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas.errors import DecodeError
from schemas.events import DeadLetter, Event
from schemas.serde import decode
from schemas.topics import BY_NAME

MAX_REASON = 2000  # a decode error can quote a whole record; the record itself travels in `value`


@dataclass(frozen=True, slots=True)
class Rejection:
    reason: str
    error_type: str

    def letter(self, *, topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None,
               consumer: str) -> DeadLetter:
        return DeadLetter(topic=topic, partition=partition, offset=offset, key=key, value=value,
                          reason=self.reason[:MAX_REASON], error_type=self.error_type, consumer=consumer)


def accept(value: bytes | None, topic: str) -> Event | Rejection:
    """The event these bytes hold if it belongs on `topic` (topics outside the catalogue take any event)."""
    try:
        event = decode(value or b"")
    except DecodeError as exc:
        return Rejection(str(exc), type(exc).__name__)
    known = BY_NAME.get(topic)
    if known is not None and type(event) not in known.events:
        return Rejection(f"{type(event).__name__} does not belong on {topic}", "WrongTopic")
    return event
