"""The verl backend (`backend: verl`): the same task groups, trained by verl's FSDP workers on a GPU cluster.

On a cluster the loop in `trainer/loop.py` stays as it is; only the update
step changes hands (an `UpdateBackend`, see `trainer/backend.py`). Each batch
of task groups becomes a verl `DataProto` in the layout verl's FSDP actor
expects for multi-turn rollouts: the segment's
opening prompt (left-padded) and everything after it as the "response",
with `response_mask` off on the gaps (tool output, user turns) and on the
model's own tokens; `old_log_probs` are the behaviour logprobs the gateway
recorded, `advantages` the task-level ones, one per rollout broadcast (or per call, with credit per call).
The config sends verl to FSDP workers (`actor_rollout_ref.actor`), vLLM
rollout replicas that sleep during the update and wake with the new weights
(`free_cache_engine`, `enable_sleep_mode`), and our per-task normalisation as
token weights in `rollout_is_weights`.

It cannot run here (no GPUs, no Ray cluster); the batch conversion, the config
and the backend against a CPU stand-in worker group are tested on the CPU.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Protocol

import torch
from omegaconf import DictConfig, OmegaConf
from verl import DataProto

from schemas.events import TaskGroup
from trainer import checkpoint
from trainer.batch import _Piece, _pieces
from trainer.checkpoint import TrainerState
from trainer.config import TrainerConfig
from trainer.errors import TrainerError
from trainer.metrics import UpdateMetrics


def to_verl(groups: list[TaskGroup], config: TrainerConfig, pad_id: int = 0) -> DataProto:
    """One verl sample per segment: (prompt, response) with masks, behaviour logprobs and advantages."""
    return _layout(_pieces(groups, config.normalise_by_std, config.loss_mode, config.credit, config.discount),
                   config.temperature, pad_id)


def _layout(pieces: list[_Piece], temperature: float, pad_id: int = 0) -> DataProto:
    firsts = [next((i for i, m in enumerate(p.mask) if m), len(p.mask)) for p in pieces]  # first trainable target
    prompts = [p.tokens[:first + 1] for p, first in zip(pieces, firsts, strict=True)]
    prompt_len = max(len(x) for x in prompts)
    response_len = max(len(p.tokens) - first for p, first in zip(pieces, firsts, strict=True))
    n = len(pieces)
    t = {"prompts": torch.full((n, prompt_len), pad_id), "responses": torch.full((n, response_len), pad_id),
         "response_mask": torch.zeros(n, response_len), "old_log_probs": torch.zeros(n, response_len),
         "advantages": torch.zeros(n, response_len), "rollout_is_weights": torch.zeros(n, response_len),
         "attention_mask": torch.zeros(n, prompt_len + response_len, dtype=torch.long)}
    for i, (p, first) in enumerate(zip(pieces, firsts, strict=True)):
        prompt = prompts[i]
        t["prompts"][i, prompt_len - len(prompt):] = torch.tensor(prompt)  # left-padded, as verl's rollouts are
        # targets[first:] are the tokens after the prompt: the "response" verl scores, gaps masked out
        response = p.targets[first:]
        span = slice(0, len(response))
        t["responses"][i, span] = torch.tensor(response)
        t["response_mask"][i, span] = torch.tensor(p.mask[first:])
        t["old_log_probs"][i, span] = torch.tensor(p.behaviour[first:])
        t["advantages"][i, span] = torch.tensor(p.advantages[first:])
        t["rollout_is_weights"][i, span] = p.weight
        t["attention_mask"][i, prompt_len - len(prompt):prompt_len + len(response)] = 1
    t["input_ids"] = torch.cat([t["prompts"], t["responses"]], dim=1)
    t["position_ids"] = (torch.cumsum(t["attention_mask"], dim=1) - 1).clamp(min=0)
    batch: DataProto = DataProto.from_dict(tensors=t, meta_info={"temperature": temperature})
    return batch


def verl_config(config: TrainerConfig, n_gpus: int, nnodes: int = 1, rollout_tp: int = 1) -> DictConfig:
    """Overrides of verl's ppo_trainer config for this run (merge onto verl's own defaults)."""
    mode = {"per-task": "token-sum", "token-mean": "token-mean", "seq-mean-token-mean": "seq-mean-token-mean"}
    overrides: dict[str, Any] = {
        "algorithm": {"adv_estimator": "grpo", "norm_adv_by_std_in_grpo": config.normalise_by_std,
                      "use_kl_in_reward": False},
        "actor_rollout_ref": {
            "model": {"path": str(config.model)},
            "actor": {"strategy": "fsdp", "optim": {"lr": config.lr, "weight_decay": config.weight_decay},
                      "grad_clip": config.max_grad_norm, "clip_ratio_low": config.clip_low,
                      "clip_ratio_high": config.clip_high, "loss_agg_mode": mode[config.loss_mode],
                      "use_kl_loss": config.kl_coef > 0, "kl_loss_coef": config.kl_coef,
                      "kl_loss_type": "low_var_kl", "ppo_epochs": 1,
                      "ppo_mini_batch_size": config.batch_groups},
            "rollout": {"name": "vllm", "tensor_model_parallel_size": rollout_tp, "free_cache_engine": True,
                        "enable_sleep_mode": True, "temperature": config.temperature,
                        "calculate_log_probs": True},
        },
        "trainer": {"n_gpus_per_node": n_gpus, "nnodes": nnodes, "project_name": "tether",
                    "experiment_name": config.run_id, "default_local_dir": str(config.run_dir / "verl")},
    }
    if n_gpus < 1:
        raise TrainerError("the verl backend needs at least one GPU per node")
    return OmegaConf.create(overrides)


class ActorRolloutWorkers(Protocol):
    """What the backend uses of verl's actor/rollout worker group (`RayPPOTrainer.actor_rollout_wg`)."""

    def update_actor(self, data: DataProto) -> DataProto: ...

    def save_checkpoint(self, local_path: str, hdfs_path: str | None = None, global_step: int = 0,
                        max_ckpt_to_keep: int | None = None) -> None: ...

    def load_checkpoint(self, local_path: str, hdfs_path: str | None = None,
                        del_local_after_load: bool = False) -> None: ...


def worker_metrics(output: DataProto) -> dict[str, float]:
    """The workers' metrics as numbers: they report lists (one per micro-batch or step) or numbers."""
    metrics: dict[str, Any] = output.meta_info.get("metrics", {})
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if isinstance(value, list) and value:
            out[key] = float(sum(value) / len(value))
        elif isinstance(value, int | float):
            out[key] = float(value)
    return out


ACTOR = "actor"  # the checkpoint's subfolder for the workers' sharded weights and optimiser


class VerlBackend:
    """An `UpdateBackend` on verl's FSDP workers. The worker group comes from verl's
    `RayPPOTrainer.init_workers()` with `verl_config`; after `update_actor` the hybrid engine wakes the vLLM
    replicas with the new weights. Checkpoints hold the workers' own (sharded) checkpoint under `actor/`, so
    the run's checkpoint folder must be on storage every node sees."""

    def __init__(self, config: TrainerConfig, workers: ActorRolloutWorkers) -> None:
        self.config, self.workers = config, workers

    @classmethod
    def open(cls, config: TrainerConfig, workers: ActorRolloutWorkers, found: Path | None) -> VerlBackend:
        """The backend, with the workers restored from the checkpoint `found` if there is one."""
        if found is not None:
            workers.load_checkpoint(str(found / ACTOR))
        return cls(config, workers)

    def update(self, groups: list[TaskGroup], version: int) -> UpdateMetrics:
        started = time.perf_counter()
        pieces = _pieces(groups, self.config.normalise_by_std, self.config.loss_mode)
        if not pieces:
            return UpdateMetrics()
        output = self.workers.update_actor(_layout(pieces, self.config.temperature))
        reported = worker_metrics(output)
        norms = output.meta_info.get("metrics", {}).get("actor/grad_norm", [])  # one per optimiser step
        stale = [version - v for p in pieces for v, m in zip(p.versions, p.mask, strict=True) if m]
        return UpdateMetrics(
            loss=reported.get("actor/pg_loss", 0.0), entropy=reported.get("actor/entropy", 0.0),
            clip_fraction=reported.get("actor/pg_clipfrac", 0.0), kl=reported.get("actor/kl_loss", 0.0),
            grad_norm=reported.get("actor/grad_norm", 0.0), optimizer_steps=len(norms) if isinstance(norms, list)
            else 1, tokens=int(sum(sum(p.mask) for p in pieces)), task_groups=len(groups),
            staleness_mean=sum(stale) / len(stale) if stale else 0.0, staleness_max=float(max(stale, default=0)),
            seconds=time.perf_counter() - started)

    def stage(self, root: Path, state: TrainerState) -> Path:
        def write(folder: Path) -> None:
            self.workers.save_checkpoint(str(folder / ACTOR), global_step=state.version)

        return checkpoint.stage(root, state, write)
