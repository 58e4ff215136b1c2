"""How the engine process serves its model; read once from TETHER_ENGINE_* variables."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class EngineSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TETHER_ENGINE_", frozen=True)

    model: str = Field(".tether/models/tiny", description="Hugging Face model name or local directory.")
    served_model_name: str | None = Field(None, description="Name clients use; defaults to the model argument.")
    host: str = "127.0.0.1"
    port: int = Field(8100, ge=1, le=65535)
    device: str = Field("auto", description="auto (cuda when available), cpu, cuda, cuda:N.")
    dtype: str = Field("float32", pattern="^(float32|bfloat16|float16)$")
    max_batch: int = Field(64, ge=1, description="Sequences decoded together in one step.")
    max_model_len: int | None = Field(None, ge=16, description="Context limit; defaults to the model config's.")
    max_logprobs: int = Field(20, ge=0)
    default_max_tokens: int | None = Field(
        None, ge=1, description="Completion limit for requests that set none (Codex sends none); default: the "
        "rest of the context, as vLLM does.",
    )
    weight_version: int = Field(0, ge=0, description="Version of the weights the engine starts with.")
    prefix_cache_mb: int = Field(
        512, ge=0, description="Memory for caches of recent prompts that later prompts extend (0: off)."
    )
    deterministic: bool = Field(
        False, description="Tokens and logprobs depend only on the request (prompt, sampling, seed), whatever else "
        "is served: prompts prefilled alone in fixed chunks, sequences decoded one per forward. Costs throughput.",
    )
    torch_threads: int | None = Field(
        None, ge=1, description="CPU threads for torch; default leaves one core to the HTTP server and others."
    )
