"""What a call asks each kind of engine for beyond the sampling: the weights (the base, or the run's adapter
once its versions are adapters), and how the answer carries its token ids.

A run with `lora:` publishes versions that are low-rank adapters
(`WeightVersionPublished.adapter`). The embedded engine switches the adapter
in for every call, so it is asked for its model as before. vLLM serves the
adapter under its own name (`model` is the adapter's name); SGLang serves it
when the request names it in `lora_path` (its OpenAI routes take the adapter
from `model` only as "base:adapter", and from `lora_path` otherwise). The
name is the one the trainer loads every version under (`schemas.adapters`).

Token ids: vLLM's `return_token_ids` answers with the prompt's ids as well as
the completion's, so a 128k-token prompt travels back to the gateway on every
call (about 0.7 MB of JSON to write, send and parse, more than the gateway's
own work on the call). vLLM and the embedded engine name each sampled token
"token_id:N" in the logprobs instead (`return_tokens_as_token_ids`, which the
gateway always asks for), and only the completion comes back. SGLang's OpenAI
routes have no such flag: they are asked `return_token_ids`.
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


def token_fields(kind: EngineKind) -> dict[str, Any]:
    """The fields of an engine request that make its answer carry the completion's token ids (`choices` reads
    them either way)."""
    if kind == "sglang":
        return {"return_token_ids": True}
    return {"return_tokens_as_token_ids": True}
