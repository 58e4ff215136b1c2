"""The embedded learner (`backend: torch`): the policy, its optimiser and the KL reference in the trainer's process.

The default update backend, and the one a laptop or a single GPU runs: each
update packs the task groups into rows (`trainer/batch.py`) and takes the
optimiser steps of `trainer/step.py`; a checkpoint is a Hugging Face folder
the engine loads directly, plus the optimiser's state.
"""

from __future__ import annotations

from pathlib import Path

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, PreTrainedModel

from trainer import checkpoint, lora, step
from trainer.advantages import ScoredGroups
from trainer.algorithms import LossConfig
from trainer.batch import build_batch
from trainer.checkpoint import TrainerState
from trainer.config import TrainerConfig
from trainer.engines.broadcast import ModuleSender, Sender
from trainer.errors import ConfigError
from trainer.metrics import UpdateMetrics
from trainer.step import StepConfig


def pick_device(choice: str) -> torch.device:
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(choice)


def step_config(config: TrainerConfig) -> StepConfig:
    """The optimiser-step settings of a trainer config."""
    loss = LossConfig(mode=config.loss_mode, clip_low=config.clip_low, clip_high=config.clip_high,
                      is_cap=config.is_cap, kl_coef=config.kl_coef)
    return StepConfig(temperature=config.temperature, max_grad_norm=config.max_grad_norm,
                      rows_per_micro_batch=config.rows_per_micro_batch, epochs=config.epochs,
                      mini_batches=config.mini_batches, loss=loss)


def _pretrained(source: Path, device: torch.device) -> PreTrainedModel:
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32, attn_implementation="sdpa")
    model.to(device)  # type: ignore[arg-type]  # transformers' typing of .to rejects a device
    return model


class TorchLearner:
    """An `UpdateBackend` on a Hugging Face causal LM held in this process."""

    def __init__(self, *, config: TrainerConfig, model: PreTrainedModel, optimizer: torch.optim.Optimizer,
                 reference: PreTrainedModel | None = None, base_digest: str | None = None) -> None:
        self.config, self.model, self.optimizer, self.reference = config, model, optimizer, reference
        self.base_digest = base_digest  # with lora: the base's, written with every checkpoint
        self.step = step_config(config)

    @classmethod
    def load(cls, config: TrainerConfig, device: torch.device, found: Path | None) -> TorchLearner:
        """From the checkpoint `found` (weights and optimiser), else from the starting model; the KL reference is
        always the starting model (with lora: the policy itself, its adapter switched off)."""
        torch.manual_seed(config.seed)
        digest = None
        if config.lora is not None:
            digest = lora.base_digest(config.model)
            base = _pretrained(config.model, device)
            adapted = lora.restore(base, config.model, found) if found is not None \
                else lora.wrap(base, config.lora, config.seed)
            model: PreTrainedModel = adapted  # type: ignore[assignment]  # a PeftModel forwards like its base
        else:
            if found is not None and lora.is_adapter(found):
                raise ConfigError(f"{found} holds an adapter: restoring it needs the lora: settings it was trained "
                                  "with")
            model = _pretrained(found or config.model, device)
        trainable = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(trainable, lr=config.lr, weight_decay=config.weight_decay,
                                      eps=config.adam_eps)
        if found is not None:
            optimizer.load_state_dict(torch.load(found / "optimizer.pt", map_location=device))
        reference = None
        if config.kl_coef > 0:
            if config.lora is not None:
                reference = model  # step.py turns the adapter off for it
            else:
                reference = _pretrained(config.model, device).eval()
                reference.requires_grad_(False)
        return cls(config=config, model=model, optimizer=optimizer, reference=reference, base_digest=digest)

    def update(self, scored: ScoredGroups, version: int) -> UpdateMetrics:
        if not scored.groups:
            return UpdateMetrics()
        batch = build_batch(scored, self.config.row_tokens, mode=self.config.loss_mode)
        return step.update(self.model, self.optimizer, batch, self.step, version, self.reference)

    def stage(self, root: Path, state: TrainerState) -> Path:
        return checkpoint.stage(root, state, self._write)

    def weight_sender(self, kind: str) -> Sender:
        return ModuleSender(kind, self.model)  # rank 0 is this process, which holds the whole model

    def close(self) -> None:
        pass  # everything lives in this process

    def _write(self, folder: Path) -> None:
        if isinstance(self.model, PeftModel):
            assert self.base_digest is not None
            lora.write(self.model, folder, self.config.model, self.base_digest)
        else:  # config + model.safetensors: loadable anywhere
            self.model.save_pretrained(folder, safe_serialization=True)
        torch.save(self.optimizer.state_dict(), folder / "optimizer.pt")
