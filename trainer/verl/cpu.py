"""verl on machines without an accelerator: a `cpu` platform for verl's PlatformRegistry.

verl 0.9.1 ships platforms for CUDA, ROCm and Ascend NPUs and falls back to
CUDA and NCCL when it finds none. This one makes verl's own Ray workers
(FSDP2 over gloo) run on the CPU, so the verl backend is exercised for real
on a laptop or a CI runner. It is loaded in every Ray worker through verl's
plugin hook (`worker_env()`: `VERL_USE_EXTERNAL_MODULES` names this module,
`VERL_PLATFORM=cpu` selects it) and never where an accelerator exists.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry

NAME = "cpu"


class _CpuDeviceModule(ModuleType):
    """`torch.cpu`, plus what verl asks of a `torch.<device>` module that the CPU has no use for: memory
    statistics (zero: no device memory), cache and IPC calls (no-ops), the RNG (the CPU generator's)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    @staticmethod
    def empty_cache() -> None:
        pass

    @staticmethod
    def ipc_collect() -> None:
        pass

    @staticmethod
    def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
        pass

    @staticmethod
    def memory_allocated(device: Any = None) -> int:
        return 0

    memory_reserved = max_memory_allocated = max_memory_reserved = memory_allocated

    @staticmethod
    def mem_get_info(device: Any = None) -> tuple[int, int]:
        pages, size = os.sysconf("SC_AVPHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        return pages * size, os.sysconf("SC_PHYS_PAGES") * size

    @staticmethod
    def get_rng_state(device: Any = None) -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, device: Any = None) -> None:
        torch.set_rng_state(state)

    @staticmethod
    def get_device_name(device: Any = None) -> str:
        return "cpu"


DEVICE_MODULE = _CpuDeviceModule("tether_cpu_device")


@PlatformRegistry.register(platform=NAME)
class PlatformCPU(PlatformBase):
    """Device `cpu`, collectives over gloo, Ray's `CPU` resource; the device calls are no-ops."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> ModuleType:
        return DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return False  # chosen only by name (VERL_PLATFORM=cpu), never by auto-detection

    def current_device(self) -> str:  # type: ignore[override]
        return "cpu"  # verl passes it to .to() and torch.device(): an index would mean cuda:0

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        pass

    def synchronize(self, device_index: int | None = None) -> None:
        pass

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        pass

    def empty_cache(self) -> None:
        pass

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"  # read by verl's workers; empty on such a machine

    @contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        yield

    def profiler_start(self) -> None:
        pass

    def profiler_stop(self) -> None:
        pass

    def ray_resource_name(self) -> str:
        return "CPU"

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {"num_cpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


def worker_env() -> dict[str, str]:
    """What a Ray worker needs in its environment to load this platform (Ray's runtime_env `env_vars`).

    `VERL_ENGINE_DEVICE=cuda`: verl registers its FSDP engine for cuda and npu only; the engine itself runs on
    whatever device the platform names."""
    return {"VERL_PLATFORM": NAME, "VERL_USE_EXTERNAL_MODULES": __name__, "VERL_ENGINE_DEVICE": "cuda"}


def wanted() -> bool:
    """No accelerator here: verl must be given this platform."""
    return not torch.cuda.is_available() and os.environ.get("VERL_PLATFORM", NAME) == NAME


def active() -> bool:
    """This process was told to use this platform (a worker started with `worker_env()`)."""
    return os.environ.get("VERL_PLATFORM") == NAME
