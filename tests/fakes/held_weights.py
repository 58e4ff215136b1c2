"""What the engine fakes share: the weights a fake holds, the calls it was sent, and failures a test asks for.

A fake holds real tensors: its launch model's at start (as a real engine
loads its `--model`), a checkpoint folder's after a disk load, and what a
weight group broadcast after a distributed update, received with the
trainer's own `TorchGroup` over gloo (where the engines' NCCL cannot run). A
test compares `fingerprint`s. Routes under /fake/ are the fakes' own:

    GET  /fake/state    {"label", "fingerprint", "paused", "sleeping", "calls": ["/route", ...]}
    POST /fake/fail     {"path": "/route", "times": 1}: the next calls of that route fail as the engine fails
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file

from trainer.engines.broadcast import TorchGroup


def fingerprint(tensors: Iterable[tuple[str, torch.Tensor]]) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(tensors, key=lambda item: item[0]):
        digest.update(f"{name}|{tensor.dtype}|{list(tensor.shape)}|".encode())
        digest.update(tensor.detach().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def read_folder(folder: Path) -> dict[str, torch.Tensor]:
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {folder}")
    tensors: dict[str, torch.Tensor] = {}
    for path in files:
        tensors.update(load_file(str(path)))
    return tensors


@dataclass
class HeldWeights:
    model: Path
    tp_size: int = 1  # one worker: the fake is one rank of the weight group
    label: str = "default"
    tensors: dict[str, torch.Tensor] | None = None  # None: discarded (asleep at level 2)
    paused: bool = False
    sleeping: bool = False
    calls: list[str] = field(default_factory=list)
    failing: dict[str, int] = field(default_factory=dict)
    groups: dict[str, TorchGroup] = field(default_factory=dict)  # name -> this fake's end (rank_offset)
    #: LoRA adapters loaded by name: (their path, the fingerprint of their tensors)
    adapters: dict[str, tuple[str, str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.tensors = read_folder(self.model)

    def fails(self, path: str) -> bool:
        """Records the call; whether a test asked for it to fail."""
        self.calls.append(path)
        left = self.failing.get(path, 0)
        if left:
            self.failing[path] = left - 1
        return left > 0

    def state(self) -> dict[str, object]:
        return {"label": self.label, "fingerprint": fingerprint(self.tensors.items()) if self.tensors else None,
                "paused": self.paused, "sleeping": self.sleeping, "calls": self.calls,
                "adapters": {name: held for name, (_, held) in self.adapters.items()}}

    @staticmethod
    def read_adapter(path: Path) -> str:
        """The fingerprint of a peft adapter folder's tensors; FileNotFoundError where it holds none."""
        if not (path / "adapter_config.json").exists() or not (path / "adapter_model.safetensors").exists():
            raise FileNotFoundError(f"No adapter found for {path}")
        return fingerprint(load_file(str(path / "adapter_model.safetensors")).items())

    @staticmethod
    def receive(group: TorchGroup, names: list[str], dtypes: list[str], shapes: list[list[int]]
                ) -> dict[str, torch.Tensor]:
        """One bucket off the group, into tensors made from its names, dtypes and shapes."""
        if not len(names) == len(dtypes) == len(shapes):
            raise ValueError(f"names, dtypes and shapes differ in length: {len(names)}, {len(dtypes)}, {len(shapes)}")
        tensors = [torch.empty(shape, dtype=getattr(torch, dtype)) for dtype, shape in zip(dtypes, shapes, strict=True)]
        group.receive(tensors)
        return dict(zip(names, tensors, strict=True))
