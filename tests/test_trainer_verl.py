"""The verl backend's pure parts: the batch layout, the mini-batch weights, verl's config, choosing a backend. Its
training behaviour, on verl's real workers, is in tests/test_trainer_backends.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from hypothesis import given
from hypothesis import strategies as st
from omegaconf import OmegaConf

from schemas.events import RolloutSample, Segment, TaskGroup
from tests.factories import T0
from trainer.advantages import ScoredGroups
from trainer.config import TrainerConfig, load_config
from trainer.errors import ConfigError
from trainer.verl.backend import _scale_mini_batches, to_verl
from trainer.verl.workers import MICRO_BATCH, actor_config

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
    t = to_verl(ScoredGroups.of(groups()), CONFIG).batch
    assert t["prompts"].tolist() == [[1, 2], [0, 7]]  # left-padded
    assert t["responses"].tolist() == [[3, 4, 5, 6], [8, 0, 0, 0]]
    assert t["response_mask"].tolist() == [[1, 1, 0, 1], [1, 0, 0, 0]]  # the tool output is not trained
    assert t["behaviour_log_probs"][0].tolist() == pytest.approx([-0.1, -0.2, 0.0, -0.3])
    assert t["advantages"][0, 0] > 0 > t["advantages"][1, 0]
    assert t["attention_mask"].tolist() == [[1, 1, 1, 1, 1, 1], [0, 1, 1, 0, 0, 0]]
    assert t["input_ids"].shape == (2, 6)


def test_rows_fill_up_to_a_multiple_with_rows_that_train_nothing() -> None:
    t = to_verl(ScoredGroups.of(groups()), CONFIG, rows_multiple=4).batch
    assert t["responses"].shape[0] == 4
    assert t["response_mask"][2:].sum() == 0 and t["token_weights"][2:].sum() == 0
    assert t["input_ids"][3].tolist() == t["input_ids"][1].tolist()  # shaped like a real row: no empty sequence


@given(st.lists(st.just(0.0) | st.floats(1e-6, 1.0), min_size=8, max_size=8),
       st.sampled_from([(1, 2), (2, 2), (2, 4), (1, 4)]))
def test_each_mini_batch_carries_the_whole_batchs_weight(masses: list[float], split: tuple[int, int]) -> None:
    """verl gives worker w rows [w*share, (w+1)*share) and each worker takes its mini-batches in order; after
    scaling, the rows of each global mini-batch weigh what the whole batch did, as in the torch learner."""
    world, minis = split
    t = {"token_weights": torch.tensor(masses)[:, None].repeat(1, 3), "response_mask": torch.ones(8, 3)}
    total = float(t["token_weights"].sum())
    _scale_mini_batches(t, world, minis)
    share, per = 8 // world, 8 // world // minis
    for j in range(minis):
        rows = [w * share + j * per + i for w in range(world) for i in range(per)]
        mass = float(t["token_weights"][rows].sum())
        assert mass == pytest.approx(total, rel=1e-5) or mass == 0.0


def test_verl_s_own_defaults_carry_the_run_s_settings() -> None:
    c = actor_config(CONFIG.model_copy(update={"lr": 0.01, "epochs": 2}), world_size=2, cpu=True)
    assert (c.actor.strategy, c.actor.fsdp_config.strategy) == ("fsdp2", "fsdp2")  # FSDP1 refuses CPU params
    assert c.actor.optim.lr == 0.01 and c.actor.ppo_epochs == 2 and c.actor.optim.clip_grad == CONFIG.max_grad_norm
    assert c.model.override_config.attn_implementation == "sdpa"  # flash attention is GPU-only
    assert actor_config(CONFIG.model_copy(update={"adam_eps": 1e-5}), world_size=2, cpu=True
                        ).actor.optim.override_optimizer_config.eps == 1e-5  # verl's AdamW takes it as given
    assert c.actor.ppo_micro_batch_size_per_gpu == MICRO_BATCH and c.rollout.name == "vllm"
    gpu = actor_config(CONFIG, world_size=8, cpu=False)
    assert gpu.actor.fsdp_config.dtype == "bfloat16" and gpu.model.override_config.attn_implementation == \
        "flash_attention_2"


def test_selecting_a_backend_in_the_config(tmp_path: Path) -> None:
    assert TrainerConfig(run_id="r", model=Path("m")).backend == "torch"  # the default: the embedded learner
    (tmp_path / "trainer.yaml").write_text(yaml.safe_dump({"run_id": "r", "model": "m", "backend": "jax"}))
    with pytest.raises(ConfigError, match=r"trainer.yaml: backend: Input should be 'torch' or 'verl'"):
        load_config(tmp_path / "trainer.yaml")
    verl = load_config_text(tmp_path, {"run_id": "r", "model": "m", "backend": "verl", "workers": 4})
    assert (verl.backend, verl.workers) == ("verl", 4)
    with pytest.raises(ConfigError, match=r"kl_coef: the verl backend starts no reference workers"):
        load_config_text(tmp_path, {"run_id": "r", "model": "m", "backend": "verl", "kl_coef": 0.01})
    with pytest.raises(ConfigError, match=r"workers: Input should be greater than or equal to 1"):
        load_config_text(tmp_path, {"run_id": "r", "model": "m", "backend": "verl", "workers": 0})


def load_config_text(folder: Path, raw: dict[str, object]) -> TrainerConfig:
    (folder / "trainer.yaml").write_text(yaml.safe_dump(raw))
    return load_config(folder / "trainer.yaml")


def test_the_cli_prints_the_config_verl_s_workers_get(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from tether.cli import app

    (tmp_path / "trainer.yaml").write_text(yaml.safe_dump({"run_id": "r", "model": "m", "backend": "verl",
                                                           "workers": 8, "lr": 0.002}))
    result = CliRunner().invoke(app, ["trainer", "verl-config", str(tmp_path / "trainer.yaml"), "--gpu"])
    assert result.exit_code == 0, result.output
    printed = OmegaConf.create(result.output)
    assert printed.actor.optim.lr == 0.002 and printed.actor.ppo_mini_batch_size == 8
    assert printed.model.override_config.attn_implementation == "flash_attention_2"
    (tmp_path / "trainer.yaml").write_text(yaml.safe_dump({"run_id": "r", "model": "m", "workers": "many"}))
    result = CliRunner().invoke(app, ["trainer", "verl-config", str(tmp_path / "trainer.yaml")])
    assert result.exit_code == 2 and "workers" in result.output
