"""Avro single-object encoding: C3 01, the writer schema's CRC-64-AVRO fingerprint, the body.

Any reader finds the writer schema by fingerprint and resolves it against its
own current schema, so events written by older code stay readable.
"""

from __future__ import annotations

import base64
import dataclasses
from datetime import datetime
from io import BytesIO
from typing import Any

from fastavro import schemaless_reader, schemaless_writer

from schemas.errors import CorruptRecord, EncodeError, InvalidEvent, NotSingleObject, SchemaError
from schemas.events import Event
from schemas.registry import Registry, default_registry

MAGIC = b"\xc3\x01"
HEADER_SIZE = len(MAGIC) + 8


def encode(event: Event, registry: Registry | None = None) -> bytes:
    """The event's single-object bytes, with its class's current schema."""
    try:
        schema = (registry or default_registry()).current(type(event))
    except SchemaError as exc:
        raise EncodeError(str(exc)) from exc
    out = BytesIO()
    out.write(MAGIC)
    out.write(schema.fingerprint)
    try:
        datum = schema.to_datum(event)
        _check_ranges(schema.parsed, datum)
        schemaless_writer(out, schema.hinted, datum)
    except (ValueError, TypeError, AttributeError, OverflowError) as exc:
        raise EncodeError(f"{type(event).__name__} does not fit its schema: {exc}") from exc
    return out.getvalue()


_LIMITS = {"int": (-(2**31), 2**31 - 1), "long": (-(2**63), 2**63 - 1)}


def _check_ranges(schema: Any, datum: Any) -> None:
    """fastavro writes an out-of-range int without complaint and it reads back as another number; refuse it."""
    if isinstance(schema, dict):
        kind = schema["type"]
        if kind == "record":
            for f in schema["fields"]:
                _check_ranges(f["type"], datum[f["name"]])
        elif kind == "array" and datum:
            items = schema["items"]
            if isinstance(items, str) and items in _LIMITS:
                _check_ranges(items, min(datum))
                _check_ranges(items, max(datum))
            elif not isinstance(items, str):
                for item in datum:
                    _check_ranges(items, item)
        elif kind in _LIMITS and schema.get("logicalType") is None:
            _check_ranges(kind, datum)
    elif isinstance(schema, list):
        if datum is not None:
            for branch in schema:
                if branch != "null":
                    _check_ranges(branch, datum)
    elif schema in _LIMITS and isinstance(datum, int) and not isinstance(datum, bool):
        low, high = _LIMITS[schema]
        if not low <= datum <= high:
            raise OverflowError(f"{datum} does not fit Avro {schema}")


def decode(data: bytes, registry: Registry | None = None) -> Event:
    """The event in `data`, read with its writer schema and resolved to the current class; DecodeError if not."""
    registry = registry or default_registry()
    if len(data) < HEADER_SIZE or data[:2] != MAGIC:
        raise NotSingleObject(f"not an Avro single-object record (starts with {data[:2].hex() or 'nothing'})")
    writer = registry.writer(bytes(data[2:HEADER_SIZE]))
    reader = registry.reader_for(writer)
    body = BytesIO(data)
    body.seek(HEADER_SIZE)
    try:
        datum = schemaless_reader(body, writer.hinted, reader.hinted)
    except Exception as exc:  # fastavro raises many unrelated types on a bad body
        raise CorruptRecord(f"{writer.name} body does not decode: {type(exc).__name__}: {exc}") from exc
    if body.tell() != len(data):
        raise CorruptRecord(f"{writer.name}: {len(data) - body.tell()} trailing bytes after the body")
    try:
        event: Event = reader.to_event(datum)
    except (InvalidEvent, TypeError, KeyError) as exc:
        raise CorruptRecord(f"{writer.name} decodes to an invalid event: {exc}") from exc
    return event


def to_jsonable(value: Any) -> Any:
    """An event as plain JSON values (bytes as base64, datetimes as ISO 8601), for people and tools."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, list):
        return [to_jsonable(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    return value
