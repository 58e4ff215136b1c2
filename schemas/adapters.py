"""Low-rank adapters as weight versions: what a checkpoint folder holding one looks like, and how its base is named.

The trainer writes it (`trainer/lora.py`) and every engine reads it, so the
layout and the base's digest are defined once, here. A folder is an adapter
when it holds peft's `adapter_config.json`; `base.json` beside it names the
weights it was trained on by a digest of their files, which an engine compares
with its own before serving the adapter (an adapter means nothing on other
weights).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

BASE_FILE = "base.json"
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
#: The name vLLM and SGLang serve a run's adapter under, version after version: the trainer loads each version's
#: adapter under it and the gateways ask for it by it
SERVED_NAME = "tether-lora"


def is_adapter(folder: Path) -> bool:
    """Whether a checkpoint folder holds an adapter rather than whole weights."""
    return (folder / ADAPTER_FILES[0]).exists()


def base_digest(base: Path) -> str:
    """A digest of a model folder's weight files (names, sizes and bytes): the same weights, the same digest.
    ValueError where the folder holds none."""
    digest = hashlib.sha256()
    files = sorted(base.glob("*.safetensors")) or sorted(base.glob("*.bin"))
    if not files:
        raise ValueError(f"{base} holds no weight files (*.safetensors or *.bin)")
    for path in files:
        digest.update(f"{path.name}|{path.stat().st_size}|".encode())
        with path.open("rb") as f:
            while chunk := f.read(1 << 22):
                digest.update(chunk)
    return digest.hexdigest()


def write_base(folder: Path, base: Path, digest: str) -> None:
    (folder / BASE_FILE).write_text(json.dumps({"path": str(base), "digest": digest}))


def base_mismatch(folder: Path, digest: str) -> str | None:
    """Why the adapter in `folder` does not belong on weights of `digest`; None where it does."""
    written = folder / BASE_FILE
    if not written.exists():
        return f"{folder} holds an adapter but not the identity of its base ({BASE_FILE})"
    try:
        recorded = json.loads(written.read_text())
    except ValueError as exc:
        return f"{written} is not JSON: {exc}"
    if not isinstance(recorded, dict) or recorded.get("digest") != digest:
        named = recorded.get("path") if isinstance(recorded, dict) else None
        return (f"the adapter in {folder} was trained on the base at {named}, not on these weights (digest "
                f"{digest[:12]}): an adapter means nothing on other weights")
    return None
