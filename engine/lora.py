"""Weight versions that are low-rank adapters: switched in beside the base weights, which load once.

The first adapter injects peft's LoRA layers into the served model in place
(the engine's own forward passes go through them unchanged); each later
version loads its matrices into the active adapter when its settings are the
same, or in a new one that replaces it otherwise. An adapter is refused unless
its `base.json` names the weights this engine started with (`schemas/adapters.py`).
The switch happens while the engine is drained, with the prefix cache cleared,
as any weight change (`Engine.exclusive`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, PeftModel, set_peft_model_state_dict
from peft.utils import load_peft_weights
from transformers import PreTrainedModel

from engine.errors import InvalidRequest
from schemas.adapters import base_digest, base_mismatch

#: LoraConfig fields that change what an adapter's layers are; the rest (paths, revision, mode) do not
_SHAPE = ("r", "lora_alpha", "target_modules", "exclude_modules", "bias", "use_rslora", "use_dora", "fan_in_fan_out",
          "layers_to_transform", "rank_pattern", "alpha_pattern", "modules_to_save")


@dataclass(frozen=True)
class Loaded:
    """An adapter read from its folder, ready to switch in."""

    folder: Path
    config: LoraConfig
    weights: dict[str, torch.Tensor]


class Adapters:
    def __init__(self, model: PreTrainedModel, base: Path | None) -> None:
        self.model, self.base = model, base
        self.active: str | None = None  # the adapter serving now
        self._digest: str | None = None
        self._peft: PeftModel | None = None
        self._shape: dict[str, Any] | None = None
        self._count = 0

    def read(self, folder: Path, device: str) -> Loaded:
        """The adapter in `folder`, checked against this engine's base (the engine keeps serving meanwhile)."""
        if self.base is None or not self.base.is_dir():
            raise InvalidRequest("this engine's model is not a local folder, so it cannot tell whether an adapter "
                                 "was trained on it: serve the base from a folder", "path")
        if self._digest is None:
            self._digest = base_digest(self.base)
        why = base_mismatch(folder, self._digest)
        if why is not None:
            raise InvalidRequest(why, "path")
        try:
            config = LoraConfig.from_pretrained(str(folder))
            weights = load_peft_weights(str(folder), device=device)
        except (OSError, ValueError, TypeError) as exc:
            raise InvalidRequest(f"{folder} is not a LoRA adapter peft can read: {exc}", "path") from exc
        config.inference_mode = True
        return Loaded(folder, config, weights)

    def switch(self, loaded: Loaded) -> None:
        """Serve `loaded` from now on; the engine is drained."""
        shape = {k: _plain(getattr(loaded.config, k, None)) for k in _SHAPE}
        name = f"v{self._count}"
        if self._peft is None:
            self._peft = PeftModel(self.model, loaded.config, adapter_name=name)  # injects into self.model
        elif shape == self._shape and self.active is not None:
            name = self.active  # the same layers: new matrices in place
        else:
            self._peft.add_adapter(name, loaded.config)
        result = set_peft_model_state_dict(self._peft, loaded.weights, adapter_name=name)
        missing = [k for k in getattr(result, "missing_keys", []) if "lora_" in k and f".{name}." in k]
        if missing:
            raise InvalidRequest(f"{loaded.folder} lacks {missing[:3]}...: not an adapter for this model", "path")
        if name != self.active:
            self._peft.set_adapter(name)
            if self.active is not None:
                self._peft.delete_adapter(self.active)
        self.active, self._shape, self._count = name, shape, self._count + 1
        self.model.eval()  # injected layers start in training mode (dropout)
        self.model.requires_grad_(False)


def _plain(value: Any) -> Any:
    """A config value comparable across loads (sets and lists of module names alike)."""
    if isinstance(value, (set, list, tuple)):
        return sorted(map(str, value))
    return value
