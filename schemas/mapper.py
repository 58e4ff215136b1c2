"""Events to and from the plain values fastavro reads and writes; the one place that knows both shapes.

Both directions walk the schema beside the value. A `bytes` field marked
`"packed": {"of": F, "as": KIND}` carries the event's field F as packed
numbers (`schemas.packed`); the Avro field named F, if the schema still has
one, is where writers before the packing put F as an Avro array. It is written
empty and read only when the packed field is empty, so old bytes keep their
values through ordinary Avro resolution.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from schemas import events
from schemas.packed import pack, unpack

NAMESPACE = "tether"

#: Every Avro record name, top-level or nested, and the class it maps to (same name, in schemas.events).
CLASSES: dict[str, type] = {
    f"{NAMESPACE}.{cls.__name__}": cls
    for cls in vars(events).values()
    if isinstance(cls, type) and dataclasses.is_dataclass(cls) and cls.__module__ == events.__name__
}


def to_avro(value: Any, schema: Any, named: dict[str, Any] | None = None) -> Any:
    """Event (or nested record) → dicts and lists, against the parsed writer `schema`; lists of primitives pass
    through untouched (they are large)."""
    named = {} if named is None else named
    if isinstance(schema, str):
        return to_avro(value, named[schema], named) if schema in named else value
    if isinstance(schema, list):  # unions are null + one branch (checked when schemas load)
        if value is None:
            return None
        (branch,) = [b for b in schema if b != "null"]
        return to_avro(value, branch, named)
    kind = schema["type"]
    if kind == "record":
        named[schema["name"]] = schema
        packed = _packed(schema)
        datum: dict[str, Any] = {}
        for f in schema["fields"]:
            name = f["name"]
            if "packed" in f:
                datum[name] = pack(f["packed"]["as"], getattr(value, f["packed"]["of"]))
            elif name in packed:
                datum[name] = []  # the array older writers used: its values travel packed now
            else:
                datum[name] = to_avro(getattr(value, name), f["type"], named)
        return datum
    if kind == "array" and value and _has_records(schema["items"], named):
        return [to_avro(item, schema["items"], named) for item in value]
    return value


def from_avro(schema: Any, datum: Any, named: dict[str, Any] | None = None) -> Any:
    """A datum read against the parsed reader `schema` → event classes, resolving named-type references."""
    named = {} if named is None else named
    if isinstance(schema, str):
        return from_avro(named[schema], datum, named) if schema in named else datum
    if isinstance(schema, list):  # unions are null + one branch (checked when schemas load)
        if datum is None:
            return None
        (branch,) = [b for b in schema if b != "null"]
        return from_avro(branch, datum, named)
    kind = schema["type"]
    if kind == "record":
        named[schema["name"]] = schema
        values: dict[str, Any] = {}
        for f in schema["fields"]:
            if "packed" in f:
                spec = f["packed"]
                data = datum[f["name"]]
                if data or spec["of"] not in values:  # else an older writer's array, read below or before
                    values[spec["of"]] = unpack(spec["as"], data)
            elif f["name"] not in values or not values[f["name"]]:
                values[f["name"]] = from_avro(f["type"], datum[f["name"]], named)
        return CLASSES[schema["name"]](**values)
    if kind == "array" and _has_records(schema["items"], named):
        return [from_avro(schema["items"], item, named) for item in datum]
    return datum


def _packed(record: dict[str, Any]) -> set[str]:
    """The event fields this record carries packed."""
    return {f["packed"]["of"] for f in record["fields"] if "packed" in f}


def _has_records(schema: Any, named: dict[str, Any]) -> bool:
    if isinstance(schema, str):
        return schema in named or schema in CLASSES
    if isinstance(schema, list):
        return any(_has_records(b, named) for b in schema)
    return bool(schema.get("type") == "record")
