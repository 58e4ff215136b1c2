"""The seam of the distributed weight path: a collective group over a TCP rendezvous, tensors broadcast from rank 0.

The trainer is rank 0; each engine worker joins at its rank offset. The group
is made the way torch.distributed makes any group from an init method (a
rendezvous at `tcp://MASTER:PORT`, then the backend's process group under the
group's name), which is how SGLang's workers join theirs
(`init_weights_update_group`). The backend is the only difference between a
GPU cluster and this machine: `nccl` there, `gloo` here, where the engine
fakes receive with the same code. vLLM's workers rendezvous through vLLM's own
NCCL weight-transfer engine instead; the trainer's end of that is vLLM's
`NCCLTrainerWeightTransferEngine` (`VllmNcclSender`, imported only where vLLM
is installed, and exercised only by `bench/gpu_check.py` on a GPU machine).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Protocol

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d


class Sender(Protocol):
    """The trainer's end of the group: joins once, then broadcasts each bucket of tensors."""

    def join(self) -> None:
        """Blocks until every rank has joined (the engines are told to join at the same time)."""
        ...

    def send(self, tensors: Sequence[torch.Tensor]) -> None:
        """Each tensor, in order, broadcast from rank 0; blocks until delivered."""
        ...

    def close(self) -> None:
        ...


class TorchGroup:
    """A torch.distributed process group of `world_size` ranks, made from `tcp://address:port` under `name`.

    One class for both ends: the trainer is rank 0 and sends, an engine worker (a fake's, here) receives into
    tensors it allocated from the names, dtypes and shapes its HTTP request carried."""

    def __init__(self, *, backend: str, address: str, port: int, rank: int, world_size: int, name: str,
                 timeout_s: float = 300.0) -> None:
        self.backend, self.address, self.port = backend, address, port
        self.rank, self.world_size, self.name = rank, world_size, name
        self.timeout = timedelta(seconds=timeout_s)
        self._group: dist.ProcessGroup | None = None

    def join(self) -> None:
        store, rank, world = next(dist.rendezvous(  # type: ignore[attr-defined]
            f"tcp://{self.address}:{self.port}", self.rank, self.world_size, timeout=self.timeout))
        store.set_timeout(self.timeout)
        self._group, _ = c10d._new_process_group_helper(world, rank, [], self.backend, store,
                                                        group_name=c10d.GroupName(self.name), timeout=self.timeout)

    def send(self, tensors: Sequence[torch.Tensor]) -> None:
        self.receive(tensors)  # a broadcast: rank 0's tensors are sent, every other rank's are filled

    def receive(self, tensors: Sequence[torch.Tensor]) -> None:
        if self._group is None:
            raise RuntimeError(f"group {self.name} not joined")
        for tensor in tensors:
            dist.broadcast(tensor, group_src=0, group=self._group)

    def close(self) -> None:
        """Shut the group down (a collective still waiting on it fails) and forget its name, so a group formed
        later can take it. Made by the helper alone, it is not in torch's rank tables, which `destroy_process_group`
        expects."""
        group, self._group = self._group, None
        if group is None:
            return
        group.shutdown()
        c10d._cleanup_process_group_global_state(group)


def vllm_gloo_name(port: int) -> str:
    """vLLM's init_info names no group; over gloo (the fakes') both ends name theirs by the rendezvous port."""
    return f"vllm-weights-{port}"


class VllmNcclSender:
    """The trainer's end of vLLM's NCCL weight group (vLLM 0.34.0): vLLM's own rendezvous (`nccl_common.
    trainer_init`: a stateless group and a PyNccl communicator on the current CUDA device), tensors broadcast one
    by one from rank 0, as vLLM's receiver expects when the workers were initialised unpacked. Needs vLLM and a
    GPU on the trainer's machine; nothing here can run it (see `bench/gpu_check.py`)."""

    def __init__(self, *, address: str, port: int, world_size: int) -> None:
        self.address, self.port, self.world_size = address, port, world_size
        self._comm: object | None = None

    def join(self) -> None:
        from vllm.distributed.weight_transfer.nccl_common import trainer_init

        self._comm = trainer_init({"master_address": self.address, "master_port": self.port,
                                   "world_size": self.world_size}, rank=0)

    def send(self, tensors: Sequence[torch.Tensor]) -> None:
        if self._comm is None:
            raise RuntimeError("vLLM weight group not joined")
        stream = torch.cuda.current_stream()
        for tensor in tensors:
            self._comm.broadcast(tensor.cuda().contiguous(), src=0, stream=stream)  # type: ignore[attr-defined]
        stream.synchronize()

    def close(self) -> None:
        self._comm = None
