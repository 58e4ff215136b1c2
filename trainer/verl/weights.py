"""The distributed weight path from verl's FSDP workers: each bucket gathered by every rank, broadcast by the first.

The fleet (`trainer/engines/fleet.py`) plans the buckets from the staged
checkpoint's headers and tells the replicas what each carries; this module is
the trainer's side of the group when the weights live in verl's workers. No
tensor passes through the trainer's process or Ray's object store:

    every rank     gathers the bucket's tensors from its FSDP shards (`DTensor.full_tensor`, a collective, in
                   the plan's order, so every rank takes part in the same gathers)
    rank 0         is rank 0 of the weight group too, and broadcasts them to the replicas' workers
                   (`trainer/engines/broadcast.open_broadcaster`: vLLM's NCCL rendezvous, or torch's group)

as verl's own rollout sync does, one bucket's worth of full tensors at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch
from torch.distributed.tensor import DTensor

from trainer.engines.base import Bucket, GroupInfo
from trainer.engines.broadcast import Broadcaster, by_name, free_port, open_broadcaster


def gathered(module: torch.nn.Module, names: Sequence[str], dtypes: Sequence[str]) -> list[torch.Tensor]:
    """The full tensors of `names` (Hugging Face names, as the checkpoint writes them) in `dtypes`; a collective
    over the module's ranks for its sharded parameters."""
    from verl.utils.model import convert_weight_keys

    model: Any = getattr(module, "_fsdp_wrapped_module", module)
    held = by_name(convert_weight_keys(module.state_dict(), model), names, "verl's workers")
    out = []
    with torch.no_grad():
        for tensor, dtype in zip(held, dtypes, strict=True):
            full = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
            out.append(full.detach().to(getattr(torch, dtype)).contiguous())
    return out


class WeightGroupEnd:
    """A worker's part in the weight group: rank 0 holds the broadcaster, the other ranks only gather."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self._broadcaster: Broadcaster | None = None
        self._device = "cpu"

    def endpoint(self, port: int) -> tuple[str, int] | None:
        if self.rank:
            return None
        import ray

        return ray.util.get_node_ip_address(), port or free_port()

    def join(self, kind: str, group: GroupInfo) -> None:
        if self.rank:
            return
        self._device = "cpu" if group.backend == "gloo" else "cuda"
        self.leave()  # a group an earlier, abandoned join formed late
        broadcaster = open_broadcaster(kind, group)
        broadcaster.join()
        self._broadcaster = broadcaster

    def joined(self) -> bool:
        return self.rank != 0 or self._broadcaster is not None

    def send(self, module: torch.nn.Module, names: Sequence[str], dtypes: Sequence[str]) -> None:
        tensors = gathered(module, names, dtypes)  # every rank: the gathers are collectives
        if self.rank:
            return
        if self._broadcaster is None:
            raise RuntimeError("this worker has not joined the weight group")
        self._broadcaster.send([t.to(self._device) for t in tensors])

    def leave(self) -> None:
        broadcaster, self._broadcaster = self._broadcaster, None
        if broadcaster is not None:
            broadcaster.close()


class WeightWorkers(Protocol):
    """What the sender asks of verl's workers (`trainer/verl/workers.VerlWorkers`)."""

    generation: int  # how many times the workers were replaced (a restart loses the group)

    def weight_endpoint(self, port: int) -> tuple[str, int]: ...

    def join_weights(self, kind: str, group: GroupInfo) -> None: ...

    def weights_joined(self) -> bool: ...

    def send_weights(self, names: list[str], dtypes: list[str]) -> None: ...

    def leave_weights(self) -> None: ...


class WorkerSender:
    """The fleet's `Sender` when verl's workers hold the weights."""

    def __init__(self, kind: str, workers: WeightWorkers) -> None:
        self.kind, self.workers = kind, workers
        self._generation: int | None = None  # the workers' generation that joined

    def endpoint(self, address: str | None, port: int) -> tuple[str, int]:
        node, chosen = self.workers.weight_endpoint(port)
        return address or node, chosen

    def join(self, group: GroupInfo) -> None:
        self.workers.join_weights(self.kind, group)
        self._generation = self.workers.generation

    def joined(self) -> bool:
        return self._generation == self.workers.generation and self.workers.weights_joined()

    def send(self, bucket: Bucket) -> None:
        self.workers.send_weights(bucket.names, bucket.dtype_names)

    def leave(self) -> None:
        generation, self._generation = self._generation, None
        if generation == self.workers.generation:  # else the workers that joined are gone, and the group with them
            self.workers.leave_weights()
