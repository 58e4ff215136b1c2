"""The trainer's configuration: one YAML file (or defaults), validated with errors naming the field."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from schemas.config_file import load_model
from schemas.events.updates import LEASE_S
from trainer.errors import ConfigError

if TYPE_CHECKING:
    from trainer.advantages import AdvantageRecipe

Logger = Literal["console", "tensorboard", "wandb", "mlflow", "swanlab", "clearml", "file"]
DEFAULT_LOGGERS: tuple[Logger, ...] = ("console", "tensorboard")
_LOGGER_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow", "swanlab": "swanlab",
                    "clearml": "clearml"}  # what each of verl's backends imports


class EngineConfig(BaseModel):
    """The engine replicas each new version is handed to, and how (`trainer/engines/`)."""
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["tether", "vllm", "sglang"] = Field(
        "tether", description="tether: the embedded engine; vllm: vLLM servers started with VLLM_SERVER_DEV_MODE=1; "
                              "sglang: SGLang servers.")
    urls: list[str] = Field(min_length=1, description="Every replica (the gateways' engines).")
    transfer: Literal["disk", "distributed"] = Field(
        "disk", description="disk: each replica loads the checkpoint folder the trainer writes (it must see the "
                            "same path); distributed: the trainer broadcasts the weights to the replicas' workers "
                            "over a collective group (NCCL), vLLM and SGLang only.")
    collocated: bool = Field(False, description="The replicas share the trainer's accelerators: they sleep before "
                                                "each update and wake after it.")
    sleep_level: Literal[1, 2] = Field(1, description="vLLM's sleep level: 1 keeps the weights in host memory, 2 "
                                                      "drops them (a new version replaces them anyway).")
    group_address: str | None = Field(
        None, description="Where the replicas' workers reach the group's rank 0 (distributed): the trainer's "
                          "process (backend torch), or verl's first worker (backend verl). Default: 127.0.0.1 for "
                          "torch, the first worker's node address as Ray knows it for verl.")
    group_port: int = Field(0, ge=0, le=65535, description="The group's rendezvous port (0: one free where rank 0 "
                                                           "runs).")
    group_backend: Literal["nccl", "gloo"] = Field("nccl", description="gloo: CPU tensors (tests).")
    group_device: str = Field("cpu", description="backend torch: where the checkpoint is read into before sending "
                                                 "(cuda for NCCL); verl's workers send from their own device.")
    group_timeout_s: float = Field(300.0, gt=0, description="The longest a collective may wait for a rank.")
    bucket_mb: int = Field(512, ge=1, description="Tensors broadcast per update_weights call, in MiB.")
    timeout_s: float = Field(600.0, gt=0, description="The longest any one engine call may take.")
    check_every_s: float = Field(5.0, gt=0, description="How often replicas are asked which version they hold "
                                                        "(a restarted one is brought to the current version).")

    @model_validator(mode="after")
    def _distributed_needs_a_group(self) -> EngineConfig:
        if self.transfer == "distributed" and self.kind == "tether":
            raise ValueError("transfer: distributed is for vllm and sglang; the embedded engine loads from disk")
        return self


class LoraSettings(BaseModel):
    """Low-rank adapters (`trainer/lora.py`): peft's LoraConfig, with the names verl uses for them."""
    model_config = ConfigDict(extra="forbid", frozen=True)

    rank: int = Field(16, ge=1, description="r: the adapters' rank (verl: lora_rank).")
    alpha: int = Field(32, gt=0, description="lora_alpha: the adapter's output is scaled by alpha / rank.")
    dropout: float = Field(0.0, ge=0, lt=1, description="lora_dropout on the adapters' input.")
    target_modules: list[str] | Literal["all-linear"] = Field(
        "all-linear", description="The modules that get adapters: all-linear (every linear layer but the output "
                                  "head, as peft and verl mean it) or names such as [q_proj, v_proj].")


class TrainerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: str = Field(min_length=1)
    model: Path = Field(description="The starting model (a Hugging Face folder); also the KL reference.")
    checkpoint_dir: Path = Field(Path(".tether/checkpoints"), description="CHECKPOINT_DIR/RUN_ID/vNNNNNN.")
    engine_url: str | None = Field(None, description="One embedded engine to load each new version into (short "
                                                    "for engine: {kind: tether, urls: [URL]}).")
    engine: EngineConfig | None = Field(None, description="The engine replicas each new version is handed to.")
    batch_groups: int = Field(8, ge=1, description="B: task groups per update.")
    max_updates: int | None = Field(None, ge=1, description="Stop after this many updates (default: run on).")
    max_staleness: int = Field(2, ge=0, description="Drop task groups sampled more versions ago than this.")
    zero_variance: Literal["drop", "keep"] = "drop"
    fill: Literal["groups", "signal"] = Field(
        "groups", description="groups: an update takes the next B task groups; signal: it takes groups until B "
                              "of them are fresh and have rewards that differ (DAPO's dynamic sampling), or "
                              "max_fill_groups in all, whichever comes first.")
    max_fill_groups: int | None = Field(None, ge=1, description="With fill: signal, the most groups one update "
                                                                "takes (default 4 B).")
    normalise_by_std: bool = True
    credit: Literal["outcome", "per-call"] = Field(
        "outcome", description="outcome: the episode's reward, broadcast to every call; per-call: each call's "
                               "return (its step reward and the later ones, discounted), against the group baseline.")
    discount: float = Field(1.0, gt=0, le=1, description="With credit per-call: the factor on each later reward.")
    advantage_level: Literal["rollout", "sample"] = Field(
        "rollout", description="rollout: the task-level advantage, each rollout one member of its task's group "
                               "however many calls it made; sample: each recorded call one member (what a trainer "
                               "that takes calls as its samples computes; rollouts with more calls weigh more in "
                               "the baseline). For comparison (bench/ablation.py); outcome credit only.")
    loss_mode: Literal["per-task", "token-mean", "seq-mean-token-mean"] = "per-task"
    lr: float = Field(3e-4, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    adam_eps: float = Field(1e-8, gt=0, description="AdamW's epsilon. Adam scales every coordinate's step to about "
                                                    "lr however small its gradient; a larger epsilon leaves those "
                                                    "near zero (tokens the policy is already sure of) nearly still.")
    max_grad_norm: float = Field(1.0, gt=0)
    clip_low: float = Field(0.2, gt=0)
    clip_high: float = Field(0.28, gt=0)
    is_cap: float = Field(2.0, ge=1, description="Truncation of the importance weights of stale tokens.")
    kl_coef: float = Field(0.0, ge=0, description="KL penalty towards the starting model (0: no reference).")
    temperature: float = Field(1.0, gt=0, description="The harness's sampling temperature.")
    row_tokens: int | None = Field(None, ge=64, description="Packed row length (default: the longest segment).")
    rows_per_micro_batch: int = Field(1, ge=1)
    epochs: int = Field(1, ge=1, description="Passes over each batch (PPO epochs).")
    mini_batches: int = Field(1, ge=1, description="Optimiser steps per pass, each on a share of the rows.")
    drain_timeout_s: float = Field(120.0, gt=0, description="How long to wait for every gateway to drain.")
    validation_wait_s: float = Field(
        900.0, ge=0, description="How long an update waits for the controller's validation round of the current "
                                 "version to be reported (so the round is served by that version alone), and how "
                                 "long the trainer waits after its last update for that version's round.")
    gateway_lease_s: float = Field(
        LEASE_S, gt=0, description="A gateway not heard from for this long (it heartbeats every 10 s by default) is "
                                "taken for dead while an update waits for it: written off with a GatewayLeft.")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    backend: Literal["torch", "verl"] = Field(
        "torch", description="What runs the update: the embedded torch learner, or verl's FSDP workers on Ray.")
    workers: int = Field(2, ge=1, description="With backend verl: data-parallel workers (one per GPU; CPU "
                                              "processes where there is none).")
    seed: int = 0
    lora: LoraSettings | None = Field(None, description="Train low-rank adapters instead of every weight: the "
                                                        "base stays frozen; checkpoints hold the adapter.")
    logger: list[Logger] = Field(
        default_factory=lambda: list(DEFAULT_LOGGERS),
        description="Where every update's metrics go, as verl's trainer.logger (verl's tracking layer): "
                    "wandb, mlflow and the others read their usual environment (WANDB_API_KEY, MLFLOW_TRACKING_URI).")
    project: str = Field("tether", min_length=1, description="The project name the trackers file the run under.")
    tensorboard_dir: Path | None = Field(None, description="TensorBoard's event files (default: the run's "
                                                           "CHECKPOINT_DIR/RUN_ID/tensorboard).")

    @field_validator("logger")
    @classmethod
    def _loggers_installed(cls, loggers: list[Logger]) -> list[Logger]:
        """Said when the file is read, not as an ImportError once the run has started."""
        for name in loggers:
            package = _LOGGER_PACKAGES.get(name)
            if package is not None and importlib.util.find_spec(package) is None:
                raise ValueError(f"{name} needs the {package} package, which is not installed here "
                                 f"(pip install {package})")
        return loggers

    @model_validator(mode="after")
    def _sample_level_is_outcome_credit(self) -> TrainerConfig:
        if self.advantage_level == "sample" and self.credit != "outcome":
            raise ValueError("advantage_level: sample takes the episode's outcome as each call's reward; it does "
                             "not combine with credit per-call")
        return self

    @model_validator(mode="before")
    @classmethod
    def _engine_url_is_short_for_engine(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("engine_url"):
            if data.get("engine"):
                raise ValueError("engine_url and engine: give one (engine_url is short for one embedded engine)")
            data = {**data, "engine": {"kind": "tether", "urls": [data["engine_url"]]}}
        return data

    @model_validator(mode="after")
    def _verl_has_no_reference(self) -> TrainerConfig:
        if self.backend == "verl" and self.kl_coef > 0:
            raise ValueError("kl_coef: the verl backend starts no reference workers, so it cannot apply a KL "
                             "penalty; set kl_coef: 0 or use backend torch")
        return self

    @model_validator(mode="after")
    def _lora_where_built(self) -> TrainerConfig:
        if self.lora is not None and self.engine is not None and self.engine.transfer == "distributed":
            raise ValueError("lora: adapters are handed to the engines from disk (their LoRA routes load a "
                             "folder); set engine.transfer: disk")
        return self

    @model_validator(mode="after")
    def _fill_cap_holds_a_batch(self) -> TrainerConfig:
        if self.max_fill_groups is not None and self.max_fill_groups < self.batch_groups:
            raise ValueError(f"max_fill_groups ({self.max_fill_groups}) is below batch_groups "
                             f"({self.batch_groups}): an update could never fill its batch")
        return self

    @property
    def fill_cap(self) -> int:
        """The most task groups one update takes."""
        if self.fill == "groups":
            return self.batch_groups
        return self.max_fill_groups if self.max_fill_groups is not None else 4 * self.batch_groups

    @property
    def run_dir(self) -> Path:
        return self.checkpoint_dir / self.run_id

    @property
    def advantage(self) -> AdvantageRecipe:
        """The settings that make advantages, as one value (imported here only: it brings torch)."""
        from trainer.advantages import AdvantageRecipe

        return AdvantageRecipe(normalise_by_std=self.normalise_by_std, credit=self.credit, discount=self.discount,
                               level=self.advantage_level)


def load_config(path: Path) -> TrainerConfig:
    """Relative `model` and `checkpoint_dir` are relative to the file."""
    def relative(raw: dict[str, Any]) -> dict[str, Any]:
        paths = ("model", "checkpoint_dir", "tensorboard_dir")
        return {**raw, **{k: str(path.parent / raw[k]) for k in paths if isinstance(raw.get(k), str)}}

    return load_model(path, TrainerConfig, ConfigError, relative)
