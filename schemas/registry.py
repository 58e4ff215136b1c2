"""The one place that maps event classes to Avro schemas and fingerprints.

Current schemas live in `avsc/<Name>.avsc`; when a schema changes, its previous
version is kept in `avsc/history/<Name>.v<N>.avsc` so that old bytes still find
their writer schema by fingerprint and resolve against the current reader.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from fastavro import parse_schema
from fastavro.schema import fingerprint, to_parsing_canonical_form

from schemas import events
from schemas.errors import UnknownSchema

AVSC_DIR = Path(__file__).parent / "avsc"
NAMESPACE = "tether"

# Every Avro record name (top-level and nested) and the class it decodes into.
CLASSES: dict[str, type] = {
    f"{NAMESPACE}.{cls.__name__}": cls
    for cls in (
        events.ModelCall,
        events.Usage,
        events.Timings,
        events.RolloutSealed,
        events.RolloutStarted,
        events.RewardReported,
        events.RolloutFinished,
        events.TaskGroup,
        events.RolloutSample,
        events.Segment,
        events.DroppedRollout,
        events.UpdateRequested,
        events.GatewayDrained,
        events.WeightVersionPublished,
        events.DeadLetter,
    )
}
EVENT_TYPES: tuple[type, ...] = typing.get_args(events.Event)


@dataclass(frozen=True)
class SchemaVersion:
    """One parsed schema and its CRC-64-AVRO fingerprint (8 bytes, little-endian as on the wire)."""

    name: str
    parsed: dict[str, Any]
    fingerprint: bytes
    source: Path


def load(path: Path) -> SchemaVersion:
    raw = json.loads(path.read_text())
    parsed = parse_schema(raw, _write_hint=False)
    assert isinstance(parsed, dict), f"{path}: a top-level schema must be a record"
    canonical = to_parsing_canonical_form(raw)
    return SchemaVersion(
        name=f"{raw.get('namespace', NAMESPACE)}.{raw['name']}",
        parsed=parsed,
        fingerprint=bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO")),
        source=path,
    )


class Registry:
    """Current schema per event class, and every known writer schema by fingerprint."""

    def __init__(self, avsc_dir: Path = AVSC_DIR) -> None:
        self._current: dict[type, SchemaVersion] = {}
        self._by_fingerprint: dict[bytes, SchemaVersion] = {}
        for path in sorted(avsc_dir.glob("*.avsc")):
            version = load(path)
            cls = CLASSES.get(version.name)
            if cls is None or cls not in EVENT_TYPES:
                raise LookupError(f"{path.name}: {version.name} is not an event class in schemas.events")
            self._current[cls] = version
            self._by_fingerprint[version.fingerprint] = version
        for path in sorted((avsc_dir / "history").glob("*.avsc")):
            version = load(path)
            self._by_fingerprint.setdefault(version.fingerprint, version)
        missing = [cls.__name__ for cls in EVENT_TYPES if cls not in self._current]
        if missing:
            raise LookupError(f"no .avsc for events {missing} in {avsc_dir}")

    def current(self, cls: type) -> SchemaVersion:
        return self._current[cls]

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


def to_avro(value: Any) -> Any:
    """Event (or nested record) → the plain dicts and lists fastavro writes; primitive lists pass through."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_avro(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, list) and value and dataclasses.is_dataclass(value[0]):
        return [to_avro(item) for item in value]
    return value


def from_avro(schema: Any, datum: Any) -> Any:
    """Plain datum read against `schema` (a parsed reader schema) → event classes."""
    if isinstance(schema, list):  # union: only the record branches need work
        if datum is None:
            return None
        records = [b for b in schema if isinstance(b, dict) and b.get("type") == "record"]
        return from_avro(records[0], datum) if records and isinstance(datum, dict) else datum
    if isinstance(schema, dict):
        kind = schema["type"]
        if kind == "record":
            cls = CLASSES[schema["name"]]
            return cls(**{f["name"]: from_avro(f["type"], datum[f["name"]]) for f in schema["fields"]})
        if kind == "array" and _holds_records(schema["items"]):
            return [from_avro(schema["items"], item) for item in datum]
    return datum


def _holds_records(schema: Any) -> bool:
    if isinstance(schema, dict):
        return schema.get("type") == "record"
    if isinstance(schema, list):
        return any(_holds_records(branch) for branch in schema)
    return False
