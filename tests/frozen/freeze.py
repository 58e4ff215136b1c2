"""Freeze the current schemas and example bytes as version N, for the backward-compatibility test.

Run once, before changing any schema: `python -m tests.frozen.freeze v2`. Frozen
versions are never rewritten; the test reads every one of them.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from schemas.registry import default_registry
from schemas.serde import encode, to_jsonable
from tests.factories import examples

HERE = Path(__file__).parent


def freeze(version: str) -> Path:
    out = HERE / version
    if out.exists():
        raise SystemExit(f"{out} exists: frozen versions are never rewritten")
    out.mkdir()
    for event in examples():
        name = type(event).__name__
        shutil.copy(default_registry().current(type(event)).source, out / f"{name}.avsc")
        (out / f"{name}.bin").write_bytes(encode(event))
        (out / f"{name}.json").write_text(json.dumps(to_jsonable(event), indent=1, sort_keys=True) + "\n")
    return out


if __name__ == "__main__":
    print(freeze(sys.argv[1]))
