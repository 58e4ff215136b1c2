"""Which model a call asks the engine for: the base, or the run's adapter once its versions are adapters.

A run with `lora:` publishes versions that are low-rank adapters
(`WeightVersionPublished.adapter`). The embedded engine switches the adapter
in for every call, so it is asked for its model as before. vLLM serves the
adapter under its own name (`model` is the adapter's name); SGLang serves it
when the request names it in `lora_path` (its OpenAI routes take the adapter
from `model` only as "base:adapter", and from `lora_path` otherwise). The
name is the one the trainer loads every version under (`schemas.adapters`).
"""

from __future__ import annotations

from typing import Any, Literal

from schemas.adapters import SERVED_NAME

EngineKind = Literal["tether", "vllm", "sglang"]


def model_fields(kind: EngineKind, model: str, adapter: bool) -> dict[str, Any]:
    """The fields of an engine request that choose the weights it is served by."""
    if not adapter or kind == "tether":
        return {"model": model}
    if kind == "vllm":
        return {"model": SERVED_NAME}
    return {"model": model, "lora_path": SERVED_NAME}
