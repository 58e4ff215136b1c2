"""verl's own actor workers on Ray (`verl.workers.engine_workers.ActorRolloutRefWorker`), as the verl backend uses them.

`VerlWorkers.start` joins (or starts) a Ray cluster, places `world_size`
workers, and has verl build its FSDP2 training engine in each from verl's own
config defaults (`actor_config`). The loss is Tether's (`tether_loss`, handed
to the workers with verl's `set_loss_fn`), so both backends optimise the same
objective. Without an accelerator the workers run on the CPU platform of
`trainer/verl/cpu.py`, FSDP2 over gloo.

What the backend asks of them: proximal log-probs (`compute_log_prob`), an
update (`update_actor`), the trained weights as a Hugging Face folder
(`export_weights`, for the inference engines), verl's sharded checkpoints,
and, for engines that take weights over a collective group, each bucket
gathered and broadcast from the first worker (`trainer/verl/weights.py`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar, cast

import ray
import torch
import verl
from omegaconf import DictConfig, OmegaConf
from safetensors.torch import save_file
from tensordict import TensorDict
from verl import DataProto
from verl.single_controller.base.decorator import Dispatch, register
from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from verl.utils import tensordict_utils as tu
from verl.utils.distributed import initialize_global_process_group_ray
from verl.utils.metric import AggregationType, Metric
from verl.workers.engine_workers import ActorRolloutRefWorker
from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

from trainer import lora
from trainer.algorithms import LossConfig, policy_loss
from trainer.config import TrainerConfig
from trainer.engines.base import GroupInfo
from trainer.errors import TrainerError, WorkersLost
from trainer.verl import cpu as cpu_mode
from trainer.verl.weights import WeightGroupEnd

ONE_TO_ALL = cast(Any, Dispatch).ONE_TO_ALL  # verl's dispatch modes are members made at run time
F = TypeVar("F", bound=Callable[..., Any])


def _register(**kwargs: Any) -> Callable[[F], F]:
    """verl's `register`, typed: it marks a worker method for dispatch and keeps its signature."""
    marked: Callable[[F], F] = register(**kwargs)
    return marked


VERL_DEFAULTS = Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml"
MICRO_BATCH = 2  # rows per forward on each worker


def actor_config(config: TrainerConfig, world_size: int, cpu: bool, adapter: Path | None = None) -> DictConfig:
    """verl's `actor_rollout_ref` defaults with this run's model, optimiser and engine settings. With `lora:`,
    verl's own LoRA settings, the workers starting from the adapter at `adapter` (`trainer.lora.initial`)."""
    base = OmegaConf.load(VERL_DEFAULTS).actor_rollout_ref
    dtype = "float32" if cpu else "bfloat16"
    lora: dict[str, Any] = {}
    if config.lora is not None:
        assert adapter is not None
        lora = {"lora_rank": config.lora.rank, "lora_alpha": config.lora.alpha,
                "target_modules": config.lora.target_modules, "lora_adapter_path": str(adapter)}
    overrides = {
        "model": {"path": str(config.model), "use_remove_padding": True, "enable_gradient_checkpointing": False,
                  # flash attention (verl's default) exists on GPUs only; sdpa handles packed rows on the CPU
                  "override_config": {"attn_implementation": "sdpa" if cpu else "flash_attention_2"}, **lora},
        "actor": {
            "strategy": "fsdp2",  # FSDP1 rejects CPU parameters in sync_module_states
            "ppo_mini_batch_size": world_size, "ppo_micro_batch_size_per_gpu": MICRO_BATCH,
            "ppo_epochs": config.epochs, "shuffle": False, "use_torch_compile": False, "entropy_coeff": 0.0,
            "calculate_entropy": True, "grad_clip": config.max_grad_norm,
            "optim": {"lr": config.lr, "weight_decay": config.weight_decay, "clip_grad": config.max_grad_norm,
                      "override_optimizer_config": {"eps": config.adam_eps}},
            "fsdp_config": {"strategy": "fsdp2", "dtype": dtype, "model_dtype": "fp32", "use_torch_compile": False,
                            "seed": config.seed,
                            # on the CPU bfloat16 buys nothing and costs the logprobs' precision
                            "mixed_precision": {"param_dtype": "fp32" if cpu else "bf16", "reduce_dtype": "fp32",
                                                "buffer_dtype": "fp32"}},
            "checkpoint": {"save_contents": ["model", "optimizer", "extra"]},
        },
        "rollout": {"name": "vllm", "log_prob_micro_batch_size_per_gpu": MICRO_BATCH},  # no rollout started here
    }
    merged = OmegaConf.merge(base, overrides)
    assert isinstance(merged, DictConfig)
    return merged


def tether_loss(model_output: dict[str, Any], data: TensorDict, dp_group: Any = None, *,
                loss: LossConfig) -> tuple[torch.Tensor, dict[str, Any]]:
    """Tether's objective (`trainer/algorithms.policy_loss`) on one micro-batch of a worker's share.

    FSDP averages gradients over the data-parallel ranks, so each rank's share of the global sum is multiplied
    by their number, as verl's own losses do. Without `prox_log_probs` π_prox is the current policy.
    seq-mean-token-mean comes as per-task does, its normalisation in `token_weights` (the backend's, counted per
    optimiser step) to be summed: verl's own divisor, `global_batch_size`, is one number for every mini-batch and
    counts filler rows."""
    log_prob = no_padding_2_padding(model_output["log_probs"], data)
    fields = ["response_mask", "behaviour_log_probs", "advantages", "token_weights"]
    if "prox_log_probs" in data:
        fields.append("prox_log_probs")
    t = data.select(*fields).to_padded_tensor()
    mask = t["response_mask"]
    prox = t["prox_log_probs"] if "prox_log_probs" in t else log_prob.detach()
    summed = dataclasses.replace(loss, mode="per-task") if loss.mode == "seq-mean-token-mean" else loss
    value, metrics = policy_loss(
        log_prob=log_prob, prox_log_prob=prox, behaviour_log_prob=t["behaviour_log_probs"],
        advantages=t["advantages"], mask=mask, token_weights=t["token_weights"], config=summed,
        batch_tokens=int(data["batch_num_tokens"]), batch_sequences=int(data["global_batch_size"]))
    dp_size = int(data["dp_size"])
    # each micro-batch's means weighted by its share of the mini-batch's tokens: summed over micro-batches and
    # averaged over ranks (verl's SUM), they are the mini-batch's token means, fillers and uneven shares included
    share = float(mask.sum()) / max(int(data["batch_num_tokens"]), 1) * dp_size
    means = {"actor/pg_clipfrac": metrics["clip_fraction"], "actor/is_weight_mean": metrics["is_weight_mean"]}
    entropy = model_output.get("entropy")
    if entropy is not None:
        per_token, total = no_padding_2_padding(entropy, data).detach(), mask.sum()
        means["actor/entropy"] = float((per_token * mask).sum() / total) if total > 0 else 0.0
    reported = {key: Metric(value=value * share, aggregation=AggregationType.SUM) for key, value in means.items()}
    reported["actor/pg_loss"] = Metric(value=value.detach() * dp_size, aggregation=AggregationType.SUM)
    return value * dp_size, reported


@contextlib.contextmanager
def _lost() -> Iterator[None]:
    try:
        yield
    except ray.exceptions.RayError as exc:
        raise WorkersLost(f"a verl worker failed: {type(exc).__name__}: {str(exc)[:500]}") from exc


class TetherActorWorker(ActorRolloutRefWorker):
    """verl's worker, plus what Tether needs of it: a plain gloo process group on the CPU (verl asks torch for
    `cpu:gloo,cpu:gloo`, which it refuses), the weights gathered into a Hugging Face folder, and the weights
    broadcast to engine replicas bucket by bucket."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if cpu_mode.active():
            initialize_global_process_group_ray(backend="gloo")
            # Ray gives each worker one thread (OMP_NUM_THREADS=1); the machine's cores are the workers' to share
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("WORLD_SIZE", "1"))))
        super().__init__(*args, **kwargs)
        self.weight_group = WeightGroupEnd(int(os.environ.get("RANK", "0")))

    @_register(dispatch_mode=ONE_TO_ALL)
    def export_weights(self, path: str) -> None:
        """Every rank gathers each full tensor (a collective); rank 0 writes them with the model's config, or,
        where the policy is a base with an adapter, the adapter's files as peft writes them."""
        engine: Any = self.actor.engine  # type: ignore[union-attr]  # built by init_model
        peft_model = getattr(engine.module, "_fsdp_wrapped_module", engine.module)
        if hasattr(peft_model, "peft_config"):
            self._export_adapter(peft_model, Path(path))
            return
        params, _ = engine.get_per_tensor_param()
        state = {name: tensor.detach().to("cpu", torch.float32).contiguous() for name, tensor in params}
        if torch.distributed.get_rank() == 0:
            folder = Path(path)
            folder.mkdir(parents=True, exist_ok=True)
            save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
            engine.model_config.hf_config.save_pretrained(folder)
        torch.distributed.barrier()

    def _export_adapter(self, peft_model: Any, folder: Path) -> None:
        from peft.utils.save_and_load import get_peft_model_state_dict

        state = {name: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().to("cpu", torch.float32)
                 .contiguous() for name, p in get_peft_model_state_dict(peft_model).items()}
        if torch.distributed.get_rank() == 0:
            folder.mkdir(parents=True, exist_ok=True)
            save_file(state, str(folder / lora.ADAPTER_FILES[1]), metadata={"format": "pt"})
            peft_model.peft_config["default"].save_pretrained(str(folder))
        torch.distributed.barrier()

    @_register(dispatch_mode=ONE_TO_ALL)
    def weight_endpoint(self, port: int) -> tuple[str, int] | None:
        """Rank 0: where it will listen as rank 0 of the weight group (its node, `port` or a free one)."""
        return self.weight_group.endpoint(port)

    @_register(dispatch_mode=ONE_TO_ALL)
    def join_weights(self, kind: str, group: GroupInfo) -> None:
        self.weight_group.join(kind, group)

    @_register(dispatch_mode=ONE_TO_ALL)
    def weights_joined(self) -> bool:
        return self.weight_group.joined()

    @_register(dispatch_mode=ONE_TO_ALL)
    def send_weights(self, names: list[str], dtypes: list[str]) -> None:
        """One bucket: every rank gathers it, rank 0 broadcasts it."""
        engine: Any = self.actor.engine  # type: ignore[union-attr]  # built by init_model
        self.weight_group.send(engine.module, names, dtypes)

    @_register(dispatch_mode=ONE_TO_ALL)
    def leave_weights(self) -> None:
        self.weight_group.leave()

    @_register(dispatch_mode=ONE_TO_ALL)
    def pid(self) -> int:
        return os.getpid()


class VerlWorkers:
    """A group of `TetherActorWorker`s on Ray, one per data-parallel rank."""

    def __init__(self, config: TrainerConfig, world_size: int) -> None:
        self.config, self.world_size = config, world_size
        self.rows_multiple = world_size * MICRO_BATCH
        self.generation = 0  # bumped by each restart: the weight group did not survive it
        self.owns_ray = False  # whether `close` shuts Ray down (this process started it)
        self.cpu = cpu_mode.wanted()
        self.group: Any = self._spawn()  # verl adds the workers' methods to it at run time

    @classmethod
    def start(cls, config: TrainerConfig, world_size: int) -> VerlWorkers:
        """Workers with the starting model; on a Ray cluster named by RAY_ADDRESS, else on a local one."""
        env = cpu_mode.worker_env() if cpu_mode.wanted() else {}
        os.environ.update(env)  # this process resolves verl's platform the same way as the workers
        owned = not ray.is_initialized()
        if owned:
            address = os.environ.get("RAY_ADDRESS")
            ray.init(address=address, num_cpus=None if address else max(world_size, os.cpu_count() or 1),
                     runtime_env={"env_vars": env}, include_dashboard=False, log_to_driver=False)
        workers = cls(config, world_size)
        workers.owns_ray = owned
        return workers

    def _spawn(self) -> Any:
        pool = self.pool = RayResourcePool([self.world_size], use_gpu=not self.cpu, max_colocate_count=1)
        adapter = lora.initial(self.config) if self.config.lora is not None else None
        worker = RayClassWithInitArgs(cls=ray.remote(TetherActorWorker),
                                      config=actor_config(self.config, self.world_size, self.cpu, adapter),
                                      role="actor")
        group: Any = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=worker,
                               device_name="cpu" if self.cpu else "cuda")
        group.init_model()
        c = self.config
        loss = LossConfig(mode=c.loss_mode, clip_low=c.clip_low, clip_high=c.clip_high, is_cap=c.is_cap)
        group.set_loss_fn(functools.partial(tether_loss, loss=loss))
        return group

    def restart(self, found: Path | None) -> None:
        """New workers in place of these (one died: the process group is gone with it), from the checkpoint
        `found` or the starting model."""
        self.stop()
        self.generation += 1
        self.group = self._spawn()
        if found is not None:
            self.load_checkpoint(found)

    def pids(self) -> list[int]:
        return list(self.group.pid())

    def log_probs(self, batch: DataProto) -> torch.Tensor:
        """The current policy's log-prob of every response token (rows, response length)."""
        td = left_right_2_no_padding(batch.to_tensordict())
        tu.assign_non_tensor(td, calculate_entropy=False, compute_loss=False)
        with _lost():
            output = self.group.compute_log_prob(td)
        return no_padding_2_padding(tu.get(output, "log_probs"), td).float()

    def update(self, batch: DataProto, mini_batches: int, epochs: int) -> dict[str, Any]:
        """verl's `update_actor`: `epochs` passes of `mini_batches` optimiser steps, in the batch's order. verl steps
        on every mini-batch, so the backend gives it none without a token to train."""
        td = left_right_2_no_padding(batch.to_tensordict())
        rows = len(batch)
        if rows % (mini_batches * self.rows_multiple):
            raise TrainerError(f"{rows} rows do not split into {mini_batches} mini-batches of micro-batches of "
                               f"{MICRO_BATCH} over {self.world_size} workers")
        tu.assign_non_tensor(td, calculate_entropy=True, global_batch_size=rows // mini_batches,
                             mini_batch_size=rows // mini_batches, epochs=epochs, seed=0,
                             dataloader_kwargs={"shuffle": False}, compute_loss=True)
        with _lost():
            output = self.group.update_actor(td)
        metrics: dict[str, Any] = tu.get(output, "metrics")
        return metrics

    def export_weights(self, folder: Path) -> None:
        with _lost():
            self.group.export_weights(str(folder))

    def save_checkpoint(self, folder: Path, step: int) -> None:
        with _lost():
            self.group.save_checkpoint(str(folder), global_step=step)

    def load_checkpoint(self, folder: Path) -> None:
        with _lost():
            self.group.load_checkpoint(str(folder))

    def weight_endpoint(self, port: int) -> tuple[str, int]:
        with _lost():
            answered: tuple[str, int] = self.group.weight_endpoint(port)[0]
        return answered

    def join_weights(self, kind: str, group: GroupInfo) -> None:
        with _lost():
            self.group.join_weights(kind, group)

    def weights_joined(self) -> bool:
        with _lost():
            return all(self.group.weights_joined())

    def send_weights(self, names: list[str], dtypes: list[str]) -> None:
        with _lost():
            self.group.send_weights(names, dtypes)

    def leave_weights(self) -> None:
        with _lost():
            self.group.leave_weights()

    def stop(self) -> None:
        for worker in self.group.workers:
            with contextlib.suppress(ray.exceptions.RayError):
                ray.kill(worker)
        with contextlib.suppress(Exception):  # its placement groups, so new workers can be placed
            groups: list[Any] = self.pool.pgs or []
            for pg in groups:
                ray.util.remove_placement_group(pg)

    def close(self) -> None:
        self.stop()
        if self.owns_ray:
            ray.shutdown()
