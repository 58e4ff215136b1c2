"""Low-rank adapters: the policy as a frozen base plus an adapter that alone trains, is checkpointed and moves.

With `lora:` in the trainer config the torch learner wraps the starting model
with peft: only the adapter's parameters take gradients, so the optimiser's
state and each checkpoint hold only them (megabytes, not the model), and the
KL reference is the same model with its adapter switched off, at no memory
cost. A checkpoint names the base it was trained on by a digest of the base's
weights (`base.json`): an adapter means nothing on other weights, so restoring
it onto another base is refused. `merge` writes base and adapter as one plain
Hugging Face folder for those who serve without adapters.

Checkpoint layout (beside `state.json` and `optimizer.pt`; `schemas/adapters.py`):

    adapter_config.json, adapter_model.safetensors   peft's own files (what vLLM's and SGLang's LoRA routes load)
    base.json                                        {"path": ..., "digest": ...} of the base
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, PreTrainedModel

from schemas.adapters import ADAPTER_FILES, base_mismatch, is_adapter, write_base
from schemas.adapters import base_digest as _digest
from trainer.config import LoraSettings, TrainerConfig
from trainer.errors import CheckpointMismatch

__all__ = ["ADAPTER_FILES", "base_digest", "check_base", "initial", "is_adapter", "merge", "peft_config", "restore",
           "wrap", "write", "write_base"]


def base_digest(base: Path) -> str:
    try:
        return _digest(base)
    except ValueError as exc:
        raise CheckpointMismatch(str(exc)) from exc


def peft_config(settings: LoraSettings) -> LoraConfig:
    return LoraConfig(r=settings.rank, lora_alpha=settings.alpha, lora_dropout=settings.dropout,
                      target_modules=settings.target_modules, bias="none", task_type="CAUSAL_LM")


def wrap(base: PreTrainedModel, settings: LoraSettings, seed: int) -> PeftModel:
    """A fresh adapter on `base` (A drawn from `seed`, B zero: the policy starts as the base); the base frozen.
    Both backends start from it, so their first steps agree."""
    torch.manual_seed(seed)
    model = get_peft_model(base, peft_config(settings))
    assert isinstance(model, PeftModel)
    return model


def initial(config: TrainerConfig) -> Path:
    """The fresh adapter of `wrap`, written once under the run's folder (`lora-init`) for workers in other
    processes to start from (verl's `lora_adapter_path`); the same seed writes the same adapter."""
    assert config.lora is not None
    folder = config.run_dir / "lora-init"
    if not is_adapter(folder):
        folder.parent.mkdir(parents=True, exist_ok=True)
        staging = folder.with_name(f".lora-init-{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        base = AutoModelForCausalLM.from_pretrained(config.model, dtype=torch.float32)
        write(wrap(base, config.lora, config.seed), staging, config.model, base_digest(config.model))
        shutil.rmtree(folder, ignore_errors=True)
        staging.rename(folder)
    return folder


def restore(base: PreTrainedModel, base_dir: Path, folder: Path) -> PeftModel:
    """The adapter of checkpoint `folder` on `base`, trainable; refused if it was trained on other weights."""
    check_base(folder, base_dir)
    return PeftModel.from_pretrained(base, folder, is_trainable=True)


def write(model: PeftModel, folder: Path, base_dir: Path, digest: str) -> None:
    """The adapter's files and the base's identity."""
    model.save_pretrained(str(folder), safe_serialization=True)
    write_base(folder, base_dir, digest)


def check_base(folder: Path, base_dir: Path) -> None:
    why = base_mismatch(folder, base_digest(base_dir))
    if why is not None:
        raise CheckpointMismatch(why)


def merge(folder: Path, base_dir: Path, out: Path) -> Path:
    """Base and the adapter of checkpoint `folder` merged into one plain Hugging Face folder at `out`."""
    check_base(folder, base_dir)
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    merged = PeftModel.from_pretrained(base, folder).merge_and_unload()
    out.mkdir(parents=True, exist_ok=True)
    merged.save_pretrained(out, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json",
                 "generation_config.json"):
        if (base_dir / name).exists() and not (out / name).exists():
            (out / name).write_bytes((base_dir / name).read_bytes())
    return out
