"""Backward compatibility: bytes written by every frozen schema version decode with today's reader."""

from __future__ import annotations

import json
import shutil
from io import BytesIO
from pathlib import Path

import pytest
from fastavro import parse_schema, schemaless_writer

from schemas.events import ModelCall
from schemas.mapper import to_avro
from schemas.registry import AVSC_DIR, EVENT_TYPES, Registry, default_registry, load
from schemas.serde import MAGIC, decode, encode, to_jsonable
from tests.factories import example

FROZEN = Path(__file__).parent / "frozen"
FROZEN_BYTES = sorted(FROZEN.glob("v*/*.bin"))


def test_every_event_is_frozen_from_its_first_version() -> None:
    """v1 froze the first events; an event type added later is frozen in the version it arrived with."""
    assert {p.stem for p in FROZEN.glob("v*/*.bin")} == {cls.__name__ for cls in EVENT_TYPES}


@pytest.mark.parametrize("path", FROZEN_BYTES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_frozen_bytes_decode_with_the_current_reader(path: Path) -> None:
    event = decode(path.read_bytes())
    assert type(event).__name__ == path.stem
    expected = json.loads(path.with_suffix(".json").read_text())
    # Fields written back then keep their values (nested records too); fields added since take their defaults.
    assert as_written(to_jsonable(event), expected) == expected


def as_written(now: object, then: object) -> object:
    """`now` cut down to the fields `then` has, at every depth."""
    if isinstance(then, dict) and isinstance(now, dict):
        return {k: as_written(now[k], v) for k, v in then.items() if k in now}
    if isinstance(then, list) and isinstance(now, list) and len(then) == len(now):
        return [as_written(n, t) for n, t in zip(now, then, strict=True)]
    return now


@pytest.mark.parametrize("path", sorted(FROZEN.glob("v*/*.avsc")), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_frozen_schema_is_a_known_writer(path: Path) -> None:
    assert load(path).fingerprint in default_registry().fingerprints(), (
        f"{path.stem} changed since {path.parent.name}: copy {path} to "
        f"schemas/avsc/history/{path.stem}.{path.parent.name}.avsc so its bytes stay readable"
    )


def test_an_older_writer_schema_resolves_against_the_current_reader(tmp_path: Path) -> None:
    """The mechanism itself: a ModelCall schema from before `error` existed, kept in history/."""
    avsc = tmp_path / "avsc"
    shutil.copytree(AVSC_DIR, avsc, ignore=shutil.ignore_patterns("history"))
    old = json.loads((AVSC_DIR / "ModelCall.avsc").read_text())
    old["fields"] = [f for f in old["fields"] if f["name"] != "error"]
    (avsc / "history").mkdir()
    (avsc / "history" / "ModelCall.v0.avsc").write_text(json.dumps(old))
    registry = Registry(avsc)

    call = example(ModelCall)
    datum = {k: v for k, v in to_avro(call, parse_schema(old)).items() if k != "error"}
    body = BytesIO()
    schemaless_writer(body, parse_schema(old), datum)
    old_bytes = MAGIC + load(avsc / "history" / "ModelCall.v0.avsc").fingerprint + body.getvalue()

    decoded = decode(old_bytes, registry)
    assert decoded == call  # `error` took its default, None
    assert old_bytes != encode(call, registry)
