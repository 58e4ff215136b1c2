"""Which Avro schema each event class is written with, and every known writer schema by fingerprint.

Current schemas live in `avsc/<Name>.avsc`; when a schema changes, its previous
version is kept in `avsc/history/<Name>.v<N>.avsc` so that old bytes still find
their writer schema by fingerprint and resolve against the current reader.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from fastavro import parse_schema
from fastavro.schema import fingerprint, to_parsing_canonical_form

from schemas import events
from schemas.errors import SchemaError, UnknownSchema
from schemas.mapper import CLASSES, NAMESPACE, reader, writer

AVSC_DIR = Path(__file__).parent / "avsc"
EVENT_TYPES: tuple[type, ...] = typing.get_args(events.Event)


@dataclass(frozen=True)
class SchemaVersion:
    """One parsed schema and its CRC-64-AVRO fingerprint (8 bytes, little-endian as on the wire)."""

    name: str
    parsed: dict[str, Any]
    fingerprint: bytes
    source: Path
    #: `parsed` marked as parsed for fastavro (its hint keys added), so encoding and decoding skip re-parsing it:
    #: that was half of fastavro's time on a ModelCall
    hinted: dict[str, Any]
    #: event → datum, and datum read with this schema as the reader's → event (schemas.mapper)
    to_datum: Callable[[Any], Any] = field(repr=False, compare=False)
    to_event: Callable[[Any], Any] = field(repr=False, compare=False)


def load(path: Path) -> SchemaVersion:
    """Parse one .avsc file; unions must be null plus one type, so every value maps to one class."""
    raw = json.loads(path.read_text())
    parsed, hinted = parse_schema(raw, _write_hint=False), parse_schema(raw)
    if not isinstance(parsed, dict) or not isinstance(hinted, dict) or parsed.get("type") != "record":
        raise SchemaError(f"{path}: a top-level schema must be a record")
    _check_unions(parsed, path)
    return SchemaVersion(
        name=f"{raw.get('namespace', NAMESPACE)}.{raw['name']}",
        parsed=parsed,
        fingerprint=bytes.fromhex(fingerprint(to_parsing_canonical_form(raw), "CRC-64-AVRO")),
        source=path,
        hinted=hinted,
        to_datum=writer(parsed),
        to_event=reader(parsed),
    )


def _check_unions(schema: Any, path: Path) -> None:
    if isinstance(schema, list):
        if len([b for b in schema if b != "null"]) != 1 or "null" not in schema:
            raise SchemaError(f"{path}: unions must be [\"null\", T], got {schema}")
        for branch in schema:
            _check_unions(branch, path)
    elif isinstance(schema, dict):
        for f in schema.get("fields", []):
            _check_unions(f["type"], path)
        for key in ("items", "values"):
            if key in schema:
                _check_unions(schema[key], path)


class Registry:
    """Built from a folder of schemas; every event class must have exactly one current schema."""

    def __init__(self, avsc_dir: Path = AVSC_DIR) -> None:
        self._current: dict[type, SchemaVersion] = {}
        self._by_fingerprint: dict[bytes, SchemaVersion] = {}
        for path in sorted(avsc_dir.glob("*.avsc")):
            version = load(path)
            cls = CLASSES.get(version.name)
            if cls is None or cls not in EVENT_TYPES:
                raise SchemaError(f"{path.name}: {version.name} is not an event class in schemas.events")
            self._current[cls] = version
            self._by_fingerprint[version.fingerprint] = version
        for path in sorted((avsc_dir / "history").glob("*.avsc")):
            version = load(path)
            self._by_fingerprint.setdefault(version.fingerprint, version)
        missing = [cls.__name__ for cls in EVENT_TYPES if cls not in self._current]
        if missing:
            raise SchemaError(f"no .avsc for events {missing} in {avsc_dir}")

    def current(self, cls: type) -> SchemaVersion:
        try:
            return self._current[cls]
        except KeyError:
            raise SchemaError(f"{cls.__name__} is not an event") from None

    def writer(self, fp: bytes) -> SchemaVersion:
        try:
            return self._by_fingerprint[fp]
        except KeyError:
            raise UnknownSchema(f"no known writer schema has fingerprint {fp.hex()}") from None

    def reader_for(self, writer: SchemaVersion) -> SchemaVersion:
        cls = CLASSES.get(writer.name)
        if cls is None or cls not in self._current:
            raise UnknownSchema(f"writer schema {writer.name} has no current event class")
        return self._current[cls]

    def fingerprints(self) -> set[bytes]:
        return set(self._by_fingerprint)


@cache
def default_registry() -> Registry:
    return Registry()
