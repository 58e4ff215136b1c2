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
    ├── ReadError           a fetch from Kafka failed (aiokafka's own errors stop at this boundary)
    ├── TopicSetupError     topics could not be created, or exist with another shape
    └── AccessDenied        Kafka refused this client; the message names the client, its principal and what
        │                   was refused (schemas.access)
        ├── AuthenticationFailed  the SASL login failed: wrong username or password
        ├── UntrustedBroker       the broker's certificate does not verify against the trusted CAs
        └── NotAuthorized         no ACL allows this principal the operation on the topic or group
"""


class BusError(Exception):
    """Root of the event layer's errors."""


class InvalidEvent(BusError, ValueError):
    """An event value breaks the contract; nothing was written."""


class EncodeError(BusError):
    """An event could not be encoded."""


class ReadError(BusError):
    """Kafka failed a fetch for a reason other than a refusal (AccessDenied); reading again may succeed."""


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


class AccessDenied(BusError):
    """Kafka refused this client: retrying will not help until a setting or an ACL changes."""


class AuthenticationFailed(AccessDenied):
    """The SASL login failed."""


class UntrustedBroker(AccessDenied):
    """TLS: the broker's certificate (or its host name) does not verify."""


class NotAuthorized(AccessDenied):
    """An ACL is missing for the operation."""
