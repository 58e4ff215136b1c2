"""The verl backend's CPU-testable parts: batch conversion, config, the update call on a recording stand-in worker
group, and choosing a backend. Its training behaviour is in tests/test_trainer_backends.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from omegaconf import OmegaConf
from verl import DataProto

from schemas.events import RolloutSample, Segment, TaskGroup
from tests.factories import T0
from trainer.backend import open_backend
from trainer.config import TrainerConfig, load_config
from trainer.errors import ConfigError, TrainerError
from trainer.verl_backend import VerlBackend, to_verl, verl_config, worker_metrics

CONFIG = TrainerConfig(run_id="r", model=Path("m"), batch_groups=2, kl_coef=0.01)


def groups() -> list[TaskGroup]:
    # one rollout of two calls merged: prompt [1 2], response [3 4], tool gap [5], response [6]
    seg = Segment(token_ids=[1, 2, 3, 4, 5, 6], loss_mask=[False, False, True, True, False, True],
                  logprobs=[0, 0, -0.1, -0.2, 0, -0.3], weight_versions=[0] * 6)
    short = Segment(token_ids=[7, 8], loss_mask=[False, True], logprobs=[0, -0.5], weight_versions=[0, 0])
    return [TaskGroup(group_id="g", run_id="r", task_id="t", group_size=2, created_at=T0, rollouts=[
        RolloutSample(rollout_id="a", reward=1.0, status="succeeded", segments=[seg]),
        RolloutSample(rollout_id="b", reward=0.0, status="succeeded", segments=[short])])]


def test_segments_become_verl_prompts_and_masked_responses() -> None:
    t = to_verl(groups(), CONFIG).batch
    assert t["prompts"].tolist() == [[1, 2], [0, 7]]  # left-padded
    assert t["responses"].tolist() == [[3, 4, 5, 6], [8, 0, 0, 0]]
    assert t["response_mask"].tolist() == [[1, 1, 0, 1], [1, 0, 0, 0]]  # the tool output is not trained
    assert t["old_log_probs"][0].tolist() == pytest.approx([-0.1, -0.2, 0.0, -0.3])
    assert t["advantages"][0, 0] > 0 > t["advantages"][1, 0]
    assert t["attention_mask"].tolist() == [[1, 1, 1, 1, 1, 1], [0, 1, 1, 0, 0, 0]]
    assert t["input_ids"].shape == (2, 6)


def test_the_config_sends_verl_our_algorithm() -> None:
    c = verl_config(CONFIG, n_gpus=8)
    assert OmegaConf.select(c, "algorithm.adv_estimator") == "grpo"
    assert OmegaConf.select(c, "actor_rollout_ref.actor.loss_agg_mode") == "token-sum"  # weights carry per-task
    assert OmegaConf.select(c, "actor_rollout_ref.rollout.enable_sleep_mode") is True
    assert OmegaConf.select(c, "actor_rollout_ref.actor.use_kl_loss") is True
    with pytest.raises(TrainerError, match="GPU"):
        verl_config(CONFIG, n_gpus=0)


class RecordingStandInWorkers:
    """A stand-in for verl's worker group that trains nothing: it keeps what it is sent and reports fixed
    metrics, as verl's workers do (lists per micro-batch, or numbers)."""

    def __init__(self) -> None:
        self.seen: list[DataProto] = []
        self.reply: DataProto = DataProto.from_dict(tensors={"x": torch.zeros(1)}, meta_info={"metrics": {
            "actor/pg_loss": [0.5, 1.5], "n": 3, "actor/grad_norm": [2.0, 4.0]}})

    def update_actor(self, data: DataProto) -> DataProto:
        self.seen.append(data)
        return self.reply

    def save_checkpoint(self, local_path: str, hdfs_path: str | None = None, global_step: int = 0,
                        max_ckpt_to_keep: int | None = None) -> None:
        raise AssertionError("not used here")

    def load_checkpoint(self, local_path: str, hdfs_path: str | None = None,
                        del_local_after_load: bool = False) -> None:
        raise AssertionError("not used here")


def test_the_backend_hands_the_batch_to_the_workers() -> None:
    workers = RecordingStandInWorkers()
    metrics = VerlBackend(CONFIG, workers).update(groups(), version=0)
    assert worker_metrics(workers.reply) == {"actor/pg_loss": 1.0, "n": 3.0, "actor/grad_norm": 3.0}
    assert workers.seen[0].batch["responses"].shape == (2, 4)
    # verl's names mapped onto the record a TrainerStep is made of
    assert (metrics.loss, metrics.grad_norm, metrics.optimizer_steps) == (1.0, 3.0, 2)
    assert (metrics.tokens, metrics.task_groups) == (4, 1)  # three trainable targets in a, one in b


def test_selecting_a_backend_in_the_config(tmp_path: Path) -> None:
    assert TrainerConfig(run_id="r", model=Path("m")).backend == "torch"  # the default: the embedded learner
    (tmp_path / "trainer.yaml").write_text(yaml.safe_dump({"run_id": "r", "model": "m", "backend": "jax"}))
    with pytest.raises(ConfigError, match=r"trainer.yaml: backend: Input should be 'torch' or 'verl'"):
        load_config(tmp_path / "trainer.yaml")
    (tmp_path / "trainer.yaml").write_text(yaml.safe_dump({"run_id": "r", "model": "m", "backend": "verl",
                                                           "engine_url": "http://engine"}))
    with pytest.raises(ConfigError, match=r"backend: .*own vLLM replicas: leave engine_url unset"):
        load_config(tmp_path / "trainer.yaml")
    verl = TrainerConfig(run_id="r", model=Path("m"), backend="verl")
    with pytest.raises(TrainerError, match="GPU" if not torch.cuda.is_available() else "worker group"):
        open_backend(verl, torch.device("cpu"), None)  # the loop cannot start verl's workers itself
