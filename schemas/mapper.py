"""Events to and from the plain values fastavro reads and writes; the one place that knows both shapes."""

from __future__ import annotations

import dataclasses
from typing import Any

from schemas import events

NAMESPACE = "tether"

#: Every Avro record name, top-level or nested, and the class it maps to (same name, in schemas.events).
CLASSES: dict[str, type] = {
    f"{NAMESPACE}.{cls.__name__}": cls
    for cls in vars(events).values()
    if isinstance(cls, type) and dataclasses.is_dataclass(cls) and cls.__module__ == events.__name__
}


def to_avro(value: Any) -> Any:
    """Event (or nested record) → dicts and lists; lists of primitives pass through untouched (they are large)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_avro(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, list) and value and dataclasses.is_dataclass(value[0]):
        return [to_avro(item) for item in value]
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
        cls = CLASSES[schema["name"]]
        return cls(**{f["name"]: from_avro(f["type"], datum[f["name"]], named) for f in schema["fields"]})
    if kind == "array" and _has_records(schema["items"], named):
        return [from_avro(schema["items"], item, named) for item in datum]
    return datum


def _has_records(schema: Any, named: dict[str, Any]) -> bool:
    if isinstance(schema, str):
        return schema in named or schema in CLASSES
    if isinstance(schema, list):
        return any(_has_records(b, named) for b in schema)
    return bool(schema.get("type") == "record")
