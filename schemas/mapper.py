"""Events to and from the plain values fastavro reads and writes; the one place that knows both shapes.

Both directions are made once per schema from it (`writer`, `reader`). A `bytes` field marked
`"packed": {"of": F, "as": KIND}` carries the event's field F as packed
numbers (`schemas.packed`); the Avro field named F, if the schema still has
one, is where writers before the packing put F as an Avro array. It is written
empty and read only when the packed field is empty, so old bytes keep their
values through ordinary Avro resolution.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from schemas import events
from schemas.packed import pack, unpack

NAMESPACE = "tether"

#: Every Avro record name, top-level or nested, and the class it maps to (same name, in the modules of schemas.events).
CLASSES: dict[str, type] = {
    f"{NAMESPACE}.{cls.__name__}": cls
    for cls in vars(events).values()
    if isinstance(cls, type) and dataclasses.is_dataclass(cls) and cls.__module__.startswith(f"{events.__name__}.")
}


Converter = Callable[[Any], Any]


def to_avro(value: Any, schema: Any) -> Any:
    """Event (or nested record) → dicts and lists, against the parsed writer `schema`."""
    return writer(schema)(value)


def from_avro(schema: Any, datum: Any) -> Any:
    """A datum read against the parsed reader `schema` → event classes."""
    return reader(schema)(datum)


def writer(schema: Any) -> Converter:
    """The function that turns an event into its datum for `schema`, made once per schema (the registry keeps it):
    a walk of the schema for every event was most of the time an event took to encode."""
    converter = _writer(schema, {})
    return converter or _same


def reader(schema: Any) -> Converter:
    """The function that turns a datum read against `schema` into its event, made once per schema."""
    converter = _reader(schema, {})
    return converter or _same


def _same(value: Any) -> Any:
    return value


def _writer(schema: Any, named: dict[str, Any]) -> Converter | None:
    """None where the value is its own datum (primitives, and lists of them: they are large)."""
    schema = _resolve(schema, named)
    if isinstance(schema, list):  # unions are null + one branch (checked when schemas load)
        (branch,) = [b for b in schema if b != "null"]
        inner = _writer(branch, named)
        return None if inner is None else (lambda value: None if value is None else inner(value))
    kind = schema["type"]
    if kind == "array":
        items = _writer(schema["items"], named)
        return None if items is None else (lambda value: [items(v) for v in value])
    if kind != "record":
        return None
    named[schema["name"]] = schema
    packed = _packed(schema)
    plain: list[str] = []
    nested: list[tuple[str, Converter]] = []
    packing: list[tuple[str, str, str]] = []
    legacy: list[str] = []
    for f in schema["fields"]:
        if "packed" in f:
            packing.append((f["name"], f["packed"]["of"], f["packed"]["as"]))
        elif f["name"] in packed:
            legacy.append(f["name"])  # the array older writers used: its values travel packed now
        elif (converter := _writer(f["type"], named)) is not None:
            nested.append((f["name"], converter))
        else:
            plain.append(f["name"])

    def write(value: Any) -> dict[str, Any]:
        datum = {name: getattr(value, name) for name in plain}
        for name, converter in nested:
            datum[name] = converter(getattr(value, name))
        for name, of, kind in packing:
            datum[name] = pack(kind, getattr(value, of))
        for name in legacy:
            datum[name] = []
        return datum

    return write


def _reader(schema: Any, named: dict[str, Any]) -> Converter | None:
    schema = _resolve(schema, named)
    if isinstance(schema, list):
        (branch,) = [b for b in schema if b != "null"]
        inner = _reader(branch, named)
        return None if inner is None else (lambda datum: None if datum is None else inner(datum))
    kind = schema["type"]
    if kind == "array":
        items = _reader(schema["items"], named)
        return None if items is None else (lambda datum: [items(d) for d in datum])
    if kind != "record":
        return None
    named[schema["name"]] = schema
    cls = CLASSES[schema["name"]]
    packed = _packed(schema)
    plain: list[str] = []
    nested: list[tuple[str, Converter]] = []
    packing: list[tuple[str, str, str]] = []
    for f in schema["fields"]:
        if "packed" in f:
            packing.append((f["name"], f["packed"]["of"], f["packed"]["as"]))
        elif f["name"] in packed:
            plain.append(f["name"])  # an older writer's array: the packed field, when not empty, wins below
        elif (converter := _reader(f["type"], named)) is not None:
            nested.append((f["name"], converter))
        else:
            plain.append(f["name"])

    def read(datum: dict[str, Any]) -> Any:
        values = {name: datum[name] for name in plain}
        for name, converter in nested:
            values[name] = converter(datum[name])
        for name, of, kind in packing:
            data = datum[name]
            if data or of not in values:
                values[of] = unpack(kind, data)
        return cls(**values)

    return read


def _resolve(schema: Any, named: dict[str, Any]) -> Any:
    """A named type's definition (a reference repeats only its name); a primitive's name stays as it is."""
    if isinstance(schema, str):
        return named.get(schema, {"type": schema})
    return schema


def _packed(record: dict[str, Any]) -> set[str]:
    """The event fields this record carries packed."""
    return {f["packed"]["of"] for f in record["fields"] if "packed" in f}


