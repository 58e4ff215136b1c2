"""Errors of the event layer, shared by every service that reads or writes the bus.

    BusError
    ├── InvalidEvent        an event breaks an invariant of the contract (raised at construction)
    ├── EncodeError         an event could not be encoded with its schema
    ├── DecodeError         bytes could not be turned into an event (the record goes to tether.deadletter)
    │   ├── NotSingleObject the bytes do not start with Avro's single-object marker
    │   ├── UnknownSchema   the writer fingerprint matches no schema this reader knows
    │   └── CorruptRecord   the body does not match its writer schema, or decodes to an invalid event
    ├── SchemaError         the schema folder and the event classes disagree (a programming error)
    ├── DeliveryError       Kafka did not acknowledge an event in time: never report it as stored
    └── TopicSetupError     topics could not be created, or exist with another shape
"""


class BusError(Exception):
    """Root of the event layer's errors."""


class InvalidEvent(BusError, ValueError):
    """An event value breaks the contract; nothing was written."""


class EncodeError(BusError):
    """An event could not be encoded."""


class DecodeError(BusError):
    """Bytes could not be decoded into an event."""


class NotSingleObject(DecodeError):
    """Missing the C3 01 single-object marker."""


class UnknownSchema(DecodeError):
    """No known writer schema has this fingerprint."""


class CorruptRecord(DecodeError):
    """The body does not decode with its writer schema, or decodes to an invalid event."""


class SchemaError(BusError):
    """The .avsc files and schemas.events do not match."""


class DeliveryError(BusError):
    """No acknowledgement in time. The caller must not report success; the event may still be stored later
    (the producer keeps retrying it), so readers trust only what a later event, such as RolloutSealed, lists."""


class TopicSetupError(BusError):
    """Topic creation failed or an existing topic does not match the catalogue."""
