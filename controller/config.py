"""A run's configuration: one YAML file saying what to run, how often, where and how it is rewarded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from controller.errors import ConfigError
from infra.sandbox.policy import Limits
from schemas.config_file import load_model
from schemas.seeds import MAX_SEED


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Harness(Strict):
    command: list[str] | None = Field(None, min_length=1, description="argv with {task.field} placeholders.")
    job_template: Path | None = Field(None, description="A batch/v1 Job manifest (YAML) for the kubernetes runner.")
    workdir: Path | None = None
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment; placeholders allowed.")
    preload: list[str] = Field(default_factory=list, description=(
        "Local runner, Python harnesses, without the sandbox: modules to import once in a zygote that forks each "
        "rollout."))
    setup: list[str] | None = Field(None, min_length=1, description=(
        "Local runner: argv run before the harness, in `workdir`, outside the sandbox (making the working copy, "
        "say); placeholders allowed. A set-up that fails is a launch that failed (retried)."))


class Sandbox(Strict):
    """Local runner: each harness in a sandbox of its own (`infra.sandbox`). Paths are relative to
    `harness.workdir` and take placeholders. The agent sees the system's folders and the interpreter read-only,
    `read_only` too, its working copy read-write, and nothing else of the machine; it runs as an unprivileged
    user, with its own processes, within `limits`, and reaches the gateway and nothing else."""
    enabled: bool = Field(True, description="false runs each harness as the controller's user with this machine's "
                                            "files and network: an explicit choice, logged at the run's start.")
    workdir: str | None = Field(None, description="The working copy (read-write, the harness's directory); "
                                                  "default harness.workdir.")
    read_only: list[str] = Field(default_factory=list, description="What the harness needs besides the system "
                                 "and the interpreter: its runtime (node_modules), its configuration, its script.")
    writable: list[str] = Field(default_factory=list, description="Folders it may write besides the working copy "
                                "(made if missing): its trajectories, say.")
    hide: list[str] = Field(default_factory=list, description="Paths under a read_only folder it must not see.")
    pass_env: list[str] = Field(default_factory=list, description=(
        "Variables of the controller's environment the harness gets besides PATH, LANG, LC_*, TZ and TERM; the "
        "rollout's own (its token, the gateway's URLs, harness.env) it always gets."))
    uid: int | None = Field(None, ge=1000, description="When the controller is root: the first of the users its "
                            "sandboxes run as, one each (default 2100000000 on); otherwise the controller's own user.")
    limits: Limits = Field(default_factory=Limits)

    @model_validator(mode="before")
    @classmethod
    def _bool(cls, value: Any) -> Any:
        """`sandbox: false` (or true) for short."""
        return {"enabled": value} if isinstance(value, bool) else value


class Reward(Strict):
    source: Literal["harness", "command"] = "harness"
    command: list[str] | None = Field(None, min_length=1, description="argv; its last output line is the reward.")
    wait_s: float = Field(10.0, gt=0, description="How long to wait for a reward the harness posted.")

    @model_validator(mode="after")
    def _command_when_needed(self) -> Reward:
        if (self.source == "command") != (self.command is not None):
            raise ValueError("reward.command is needed exactly when reward.source is 'command'")
        return self


class Kubernetes(Strict):
    namespace: str = "default"
    kubeconfig: Path | None = Field(None, description="Default: in-cluster config, then ~/.kube/config.")
    host: str | None = Field(None, description="API server URL, overriding the kubeconfig (tests, proxies).")
    creations_per_s: float = Field(5.0, gt=0, description="Job creation rate limit.")
    ttl_s: int = Field(600, ge=0, description="ttlSecondsAfterFinished of each Job.")


def _greedy() -> list[float | None]:
    return [0.0]


class Validation(Strict):
    """Held-out tasks, scored per weight version with the same harness through the gateway; never trained on."""
    dataset: Path = Field(description="JSONL of held-out tasks (the same shape as the training dataset).")
    every: int = Field(5, ge=1, description="Validate every N weight versions, plus version 0 and the final one.")
    temperatures: list[float | None] = Field(
        default_factory=_greedy, min_length=1,
        description="One setting per entry: 0 is greedy, a number pins that temperature, null leaves the "
                    "harness's own sampling (the training one). The gateway applies it to every call.")
    samples: int = Field(1, ge=1, description="Rollouts per task and setting.")

    @model_validator(mode="after")
    def _distinct(self) -> Validation:
        for t in self.temperatures:
            if t is not None and not 0.0 <= t <= 2.0:
                raise ValueError(f"validation.temperatures: {t} is not a sampling temperature (0 to 2)")
        if len(set(self.temperatures)) != len(self.temperatures):
            raise ValueError("validation.temperatures: each setting once")
        return self


class RunConfig(Strict):
    run_id: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    dataset: Path
    group_size: int = Field(ge=1, description="K: rollouts per task.")
    harness: Harness
    runner: Literal["local", "kubernetes"] = "local"
    concurrency: int = Field(4, ge=1, description="Rollouts running at once.")
    timeout_s: float = Field(600.0, gt=0, description="Per rollout; then SIGTERM, then SIGKILL after grace_s.")
    grace_s: float = Field(5.0, ge=0)
    max_groups_in_flight: int = Field(8, ge=1, description="Task groups started and not yet finished.")
    max_attempts: int = Field(3, ge=1, description="Attempts per rollout when the harness cannot start.")
    sync_batch: int | None = Field(None, ge=1, description="Synchronous mode: launch this many task groups, "
                                   "wait for all of them and for the trainer's next version, repeat.")
    reward: Reward = Field(default_factory=Reward)
    sandbox: Sandbox = Field(default_factory=Sandbox, description="Local runner: the harness's sandbox.")
    validation: Validation | None = Field(None, description="Held-out validation during training.")
    kubernetes: Kubernetes = Field(default_factory=Kubernetes)
    log_dir: Path = Field(Path(".tether/runs"), description="Per-rollout logs go to LOG_DIR/RUN_ID/.")
    seed: int = Field(0, ge=0, le=MAX_SEED, description="The run's seed: each rollout's (TETHER_SEED, and where "
                      "the gateway draws the seeds of its unseeded calls) comes from it, the task and the rollout's "
                      "index, so a run with the same seed gives its rollouts the same seeds.")

    @model_validator(mode="after")
    def _harness_for_runner(self) -> RunConfig:
        if self.runner == "local" and not self.harness.command:
            raise ValueError("harness.command is needed for the local runner")
        if self.runner == "kubernetes" and not self.harness.job_template:
            raise ValueError("harness.job_template is needed for the kubernetes runner")
        if self.runner == "kubernetes" and self.harness.preload:
            raise ValueError("harness.preload is for the local runner (a Job starts its own interpreter)")
        if self.runner == "kubernetes" and self.harness.setup:
            raise ValueError("harness.setup is for the local runner (a Job's init containers make its pod ready)")
        if self.runner == "local" and self.sandbox.enabled and not (self.sandbox.workdir or self.harness.workdir):
            raise ValueError("sandbox: name the agent's working copy (sandbox.workdir, or harness.workdir): it is "
                             "the one folder the agent may write")
        if self.runner == "local" and self.sandbox.enabled and self.harness.preload:
            raise ValueError("harness.preload forks each harness from one interpreter outside any sandbox: set "
                             "sandbox: false with it, or drop it (a sandboxed harness starts its own interpreter)")
        return self

    @property
    def run_dir(self) -> Path:
        return self.log_dir / self.run_id


def keep_config(config: RunConfig) -> Path:
    """The run's settings as run, paths absolute, in its folder (`run.yaml`): what `tether repro RUN` runs again
    by default. `load_config` reads it back as it was."""
    config.run_dir.mkdir(parents=True, exist_ok=True)
    path = config.run_dir / "run.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json", exclude_defaults=True), sort_keys=False))
    return path


def load_config(path: Path) -> RunConfig:
    """Relative paths in the file are relative to the file, and come out absolute: harnesses and reward
    commands run in `harness.workdir`, where a path relative to the controller's directory names nothing."""
    config = load_model(path, RunConfig, ConfigError)
    base = path.absolute().parent
    resolve: dict[str, Any] = {"dataset": base / config.dataset, "log_dir": base / config.log_dir}
    if config.validation is not None:
        resolve["validation"] = config.validation.model_copy(update={"dataset": base / config.validation.dataset})
    harness = config.harness.model_copy(update={
        k: base / v for k, v in (("job_template", config.harness.job_template), ("workdir", config.harness.workdir))
        if v is not None})
    return config.model_copy(update={**resolve, "harness": harness})


def load_tasks(path: Path) -> list[dict[str, Any]]:
    """JSONL, one task per line with a unique non-empty string `id`; errors name the line."""
    tasks: list[dict[str, Any]] = []
    seen: set[str] = set()
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ConfigError(f"dataset {path}: cannot read: {exc}") from exc
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            task = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"dataset {path}:{n}: not JSON: {exc.msg}") from exc
        if not isinstance(task, dict) or not isinstance(task.get("id"), str) or not task["id"]:
            raise ConfigError(f"dataset {path}:{n}: a task is an object with a non-empty string 'id'")
        if task["id"] in seen:
            raise ConfigError(f"dataset {path}:{n}: task id {task['id']!r} appears twice")
        seen.add(task["id"])
        tasks.append(task)
    if not tasks:
        raise ConfigError(f"dataset {path}: no tasks")
    return tasks
