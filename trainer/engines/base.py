"""What a weight hand-over asks of one engine replica, and the tensors it carries.

Each phase is one exchange (or a few) in the engine's own API; the fleet
(`trainer/engines/fleet.py`) runs them on every replica in order. Versions
travel as labels: the decimal weight version, so that any replica can be
asked which version it holds (a restarted one answers its launch label,
which is no version of the run).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import torch
from safetensors import safe_open

WakeTag = Literal["weights", "kv_cache"]


def label(version: int) -> str:
    return str(version)


def version_of(label_: object) -> int | None:
    """The run's version a replica's label names; None for any other label (a launch default, a stranger's)."""
    text = str(label_)
    return int(text) if text.isdigit() else None


@dataclass(frozen=True)
class GroupInfo:
    """Where a replica's workers join the trainer's weight group, and at which ranks."""
    address: str
    port: int
    rank_offset: int
    world_size: int
    name: str
    backend: str
    timeout_s: float = 300.0  # a collective that waits longer fails (a replica that refused leaves the sender waiting)


# safetensors' dtype codes (its header's "dtype") as torch names them
SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                      "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
                      "BOOL": torch.bool}


@dataclass(frozen=True)
class Bucket:
    """Tensors broadcast together, named by the staged checkpoint (`source`): the names, dtypes and shapes go to
    the engine over HTTP, the data over the group, from wherever the sender holds the weights (the checkpoint read
    back, or the trainer's own ranks)."""
    source: Path
    names: list[str]
    dtypes: list[torch.dtype]
    shapes: list[list[int]]

    @property
    def dtype_names(self) -> list[str]:
        return [str(d).removeprefix("torch.") for d in self.dtypes]

    def read(self, device: str = "cpu") -> list[torch.Tensor]:
        """The bucket's tensors from the checkpoint, in order."""
        wanted = set(self.names)
        found: dict[str, torch.Tensor] = {}
        for path in sorted(self.source.glob("*.safetensors")):
            with safe_open(str(path), framework="pt", device=device) as f:
                for name in wanted.intersection(f.keys()):
                    found[name] = f.get_tensor(name).contiguous()
        return [found[name] for name in self.names]


def buckets(folder: Path, max_bytes: int) -> list[Bucket]:
    """The staged checkpoint's tensors (its *.safetensors, names sorted) in buckets of at most `max_bytes` (a larger
    tensor goes alone), read from the files' headers alone: the data is the sender's to read or to hold."""
    plan: list[Bucket] = []
    names: list[str] = []
    dtypes: list[torch.dtype] = []
    shapes: list[list[int]] = []
    size = 0
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            for name in sorted(f.keys()):
                meta = f.get_slice(name)
                dtype, shape = SAFETENSORS_DTYPES[meta.get_dtype()], list(meta.get_shape())
                nbytes = math.prod(shape) * dtype.itemsize
                if names and size + nbytes > max_bytes:
                    plan.append(Bucket(folder, names, dtypes, shapes))
                    names, dtypes, shapes, size = [], [], [], 0
                names.append(name)
                dtypes.append(dtype)
                shapes.append(shape)
                size += nbytes
    if names:
        plan.append(Bucket(folder, names, dtypes, shapes))
    return plan


class Replica(Protocol):
    """One engine server, spoken to in its own API. Every method raises `trainer.errors.EngineError` on a refusal
    or an unreachable server, naming the replica and the phase."""

    url: str

    async def held(self) -> int | None:
        """The version it serves (None: a label that is no version of the run, as after a restart)."""
        ...

    async def workers(self) -> int:
        """How many ranks it joins a weight group with (its tensor, pipeline and data parallel workers)."""
        ...

    async def pause(self) -> None:
        """Stop generating; the gateways have drained, so nothing of the run's is in flight."""
        ...

    async def resume(self) -> None:
        ...

    async def sleep(self, level: int) -> None:
        """Give up accelerator memory for the update (collocated): 1 keeps the weights in host memory, 2 drops them."""
        ...

    async def wake(self, tags: Sequence[WakeTag]) -> None:
        ...

    async def load(self, folder: Path, version: int) -> None:
        """The disk path: the engine reads the checkpoint folder and labels its weights `version`."""
        ...

    async def join(self, group: GroupInfo) -> None:
        """Join the trainer's weight group (blocks until every rank has, the trainer's too)."""
        ...

    async def begin(self) -> None:
        """Open a weight update over the group."""
        ...

    async def receive(self, bucket: Bucket) -> None:
        """Take one bucket (blocks while the trainer broadcasts it)."""
        ...

    async def end(self, version: int) -> None:
        """Close the update, labelling the weights `version`."""
        ...

    async def abandon(self) -> None:
        """After a broken broadcast: close whatever update session is open and leave the group (best effort: the
        weights are reloaded from disk next, and a new group is formed for the next update)."""
        ...

    async def reset_cache(self) -> None:
        """Drop the prefix cache: its entries were computed by the old weights."""
        ...

    async def aclose(self) -> None:
        ...
