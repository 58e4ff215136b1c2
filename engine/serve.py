"""Run the engine server for one model: `tether engine serve`."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from engine.app import create_app
from engine.engine import Engine
from engine.settings import EngineSettings
from infra.serving import serve_app


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def load_engine(settings: EngineSettings) -> Engine:
    """The same code takes the tiny model's directory or a Hugging Face model name."""
    device = pick_device(settings.device)
    if device.type == "cpu":
        # Decode steps of a small model do not scale across cores, while the HTTP thread needs one.
        torch.set_num_threads(settings.torch_threads or max(1, (os.cpu_count() or 2) - 1))
    tokenizer = AutoTokenizer.from_pretrained(settings.model)
    model = AutoModelForCausalLM.from_pretrained(settings.model, dtype=getattr(torch, settings.dtype))
    model.to(device)  # type: ignore[arg-type]  # transformers' typing of .to rejects a device
    return Engine(model, tokenizer, max_batch=settings.max_batch, max_model_len=settings.max_model_len,
                  version=settings.weight_version, prefix_cache_bytes=settings.prefix_cache_mb << 20,
                  base=Path(settings.model) if Path(settings.model).is_dir() else None,
                  deterministic=settings.deterministic)


def serve(settings: EngineSettings) -> None:
    engine = load_engine(settings)
    app = create_app(engine, settings.served_model_name or settings.model, settings.max_logprobs,
                     default_max_tokens=settings.default_max_tokens)
    serve_app(app, host=settings.host, port=settings.port, log_level="warning")
