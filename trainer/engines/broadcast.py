"""The seam of the distributed weight path: a collective group over a TCP rendezvous, tensors broadcast from rank 0.

Two layers. A `Broadcaster` is one rank-0 end of a group: it joins and
broadcasts tensors it is given. A `Sender` is the trainer's side of a
hand-over: it says where rank 0 listens, joins, and sends each bucket of the
plan from wherever the weights are: `ModuleSender` from the torch learner's
model in the trainer's process; verl's FSDP workers gather each bucket and
broadcast it from their first rank (`trainer/verl/weights.py`);
`CheckpointSender`, the fleet's default, reads the staged checkpoint back.

Rank 0 is the trainer's side; each engine worker joins at its rank offset. The
group is made the way torch.distributed makes any group from an init method (a
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

import socket
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Protocol

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from trainer.engines.base import Bucket, GroupInfo


class Broadcaster(Protocol):
    """Rank 0 of one group: joins once, then broadcasts the tensors it is given."""

    def join(self) -> None:
        """Blocks until every rank has joined (the engines are told to join at the same time)."""
        ...

    def send(self, tensors: Sequence[torch.Tensor]) -> None:
        """Each tensor, in order, broadcast from rank 0; blocks until delivered."""
        ...

    def close(self) -> None:
        ...


class Sender(Protocol):
    """The trainer's side of every hand-over over a group: formed once, then a plan of buckets per version."""

    def endpoint(self, address: str | None, port: int) -> tuple[str, int]:
        """Where rank 0 will listen, which the replicas are told: the configured address (None: this side's own)
        and port (0: one free where rank 0 runs)."""
        ...

    def join(self, group: GroupInfo) -> None:
        """Rank 0 joins `group`; blocks until every rank has."""
        ...

    def joined(self) -> bool:
        """Whether rank 0 is still in the group it joined (False again after `leave`, or where the ranks that held
        it were replaced)."""
        ...

    def send(self, bucket: Bucket) -> None:
        """The bucket's tensors, in its order and dtypes, broadcast from rank 0; blocks until delivered."""
        ...

    def leave(self) -> None:
        """Drop the group (best effort: a broken one, or one a restarted replica left, is formed anew)."""
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


def open_broadcaster(kind: str, group: GroupInfo) -> Broadcaster:
    """Rank 0 of `group`: vLLM's own NCCL rendezvous for vLLM over NCCL; torch's group (SGLang's, and the fakes'
    over gloo) otherwise."""
    if kind == "vllm" and group.backend == "nccl":
        return VllmNcclSender(address=group.address, port=group.port, world_size=group.world_size)
    name = vllm_gloo_name(group.port) if kind == "vllm" else group.name
    return TorchGroup(backend=group.backend, address=group.address, port=group.port, rank=0,
                      world_size=group.world_size, name=name, timeout_s=group.timeout_s)


class CheckpointSender:
    """The weights read back from the staged checkpoint onto `device` and broadcast from this process: the fleet's
    default, for a caller that holds no weights of its own (`bench/gpu_check.py`, a trainer with no sender)."""

    def __init__(self, kind: str, device: str = "cpu") -> None:
        self.kind, self.device = kind, device
        self._broadcaster: Broadcaster | None = None

    def endpoint(self, address: str | None, port: int) -> tuple[str, int]:
        return address or "127.0.0.1", port or free_port()

    def join(self, group: GroupInfo) -> None:
        self.leave()  # a group an earlier, abandoned join formed late
        broadcaster = open_broadcaster(self.kind, group)
        broadcaster.join()
        self._broadcaster = broadcaster

    def joined(self) -> bool:
        return self._broadcaster is not None

    def send(self, bucket: Bucket) -> None:
        if self._broadcaster is None:
            raise RuntimeError("weight group not joined")
        self._broadcaster.send(self.tensors(bucket))

    def tensors(self, bucket: Bucket) -> list[torch.Tensor]:
        return bucket.read(self.device)

    def leave(self) -> None:
        broadcaster, self._broadcaster = self._broadcaster, None
        if broadcaster is not None:
            broadcaster.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


class ModuleSender(CheckpointSender):
    """The weights of a module this process trains (the torch learner's), sent as they are in memory: the plan's
    names and dtypes, from the module's own device (the CPU over gloo)."""

    def __init__(self, kind: str, module: torch.nn.Module) -> None:
        super().__init__(kind)
        self.module = module

    def join(self, group: GroupInfo) -> None:
        self.device = "cpu" if group.backend == "gloo" else str(next(self.module.parameters()).device)
        super().join(group)

    def tensors(self, bucket: Bucket) -> list[torch.Tensor]:
        held = by_name(self.module.state_dict(), bucket.names, "the trained module")
        with torch.no_grad():
            return [t.detach().to(self.device, dtype).contiguous()
                    for t, dtype in zip(held, bucket.dtypes, strict=True)]


def by_name(state: Mapping[str, torch.Tensor], names: Sequence[str], holder: str) -> list[torch.Tensor]:
    """`names` from `state`, in order; a clear error where the checkpoint names a tensor `holder` does not hold
    (the plan is the checkpoint's, the data the trainer's: they must agree)."""
    missing = [name for name in names if name not in state]
    if missing:
        raise KeyError(f"the checkpoint names tensors {holder} does not hold: {missing[:5]}")
    return [state[name] for name in names]
