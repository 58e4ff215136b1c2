"""One contract for every update backend the loop can be given (trainer/backend.py): the embedded torch learner, and
verl's worker-group backend driven by a CPU stand-in for verl's workers (no Ray, FSDP or vLLM here)."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM, PreTrainedModel
from verl import DataProto
from verl.trainer.ppo import core_algos
from verl.utils.torch_functional import logprobs_from_logits

from schemas.events import RolloutSample, Segment, TaskGroup, TrainerStep
from tests.factories import T0
from trainer import checkpoint
from trainer.backend import UpdateBackend
from trainer.checkpoint import TrainerState
from trainer.config import TrainerConfig
from trainer.learner import TorchLearner
from trainer.metrics import UpdateMetrics, UpdateRecord
from trainer.verl_backend import VerlBackend

PROMPT, GOOD, BAD = [5, 17, 99, 42], [300, 301, 302], [700, 701, 702]


class CpuStandInWorkers:
    """A stand-in for verl's actor/rollout worker group (`RayPPOTrainer.actor_rollout_wg`) on the CPU. It does
    what verl's actor does with the batch `to_verl` lays out: score each response after its left-padded prompt
    and take one step of verl's clipped objective, token-summed with `rollout_is_weights`, here with a tiny
    model and AdamW; its checkpoint is a torch file of weights and optimiser."""

    def __init__(self, model_dir: Path, lr: float) -> None:
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa")
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr)
        self.calls = 0

    def update_actor(self, data: DataProto) -> DataProto:
        self.calls += 1
        t = data.batch
        prompt_len = t["prompts"].shape[1]
        self.model.train()
        logits = self.model(input_ids=t["input_ids"], attention_mask=t["attention_mask"],
                            position_ids=t["position_ids"]).logits
        log_prob = logprobs_from_logits(logits[:, prompt_len - 1:-1].float() / data.meta_info["temperature"],
                                        t["responses"])
        mask = t["response_mask"]
        config = OmegaConf.create({"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28,
                                   "clip_ratio_c": 3.0, "global_batch_info": {
                                       "batch_num_tokens": int(mask.sum()), "global_batch_size": len(mask)}})
        loss, metrics = core_algos.get_policy_loss_fn("vanilla")(
            old_log_prob=t["old_log_probs"], log_prob=log_prob, advantages=t["advantages"], response_mask=mask,
            loss_agg_mode="token-sum", config=config, rollout_is_weights=t["rollout_is_weights"])
        self.optimizer.zero_grad()
        loss.backward()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0))
        self.optimizer.step()
        out: DataProto = DataProto.from_dict(tensors={"x": torch.zeros(1)}, meta_info={"metrics": {
            "actor/pg_loss": [float(loss.detach())], "actor/pg_clipfrac": [float(metrics["actor/pg_clipfrac"])],
            "actor/grad_norm": [grad_norm]}})
        return out

    def save_checkpoint(self, local_path: str, hdfs_path: str | None = None, global_step: int = 0,
                        max_ckpt_to_keep: int | None = None) -> None:
        os.makedirs(local_path)
        torch.save({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), "step": global_step},
                   Path(local_path) / "stand_in.pt")

    def load_checkpoint(self, local_path: str, hdfs_path: str | None = None,
                        del_local_after_load: bool = False) -> None:
        saved: dict[str, Any] = torch.load(Path(local_path) / "stand_in.pt")
        self.model.load_state_dict(saved["model"])
        self.optimizer.load_state_dict(saved["optimizer"])


@dataclass(frozen=True)
class Subject:
    """A backend under test, and the model whose log-probs show what its updates did."""
    backend: UpdateBackend
    policy: PreTrainedModel


Open = Callable[[Path | None], Subject]  # a backend restored from a checkpoint folder, or fresh


def config_for(tiny_model: Path) -> TrainerConfig:
    return TrainerConfig(run_id="run", model=tiny_model, lr=1e-3, device="cpu")


@pytest.fixture(params=["torch", "verl (CPU stand-in workers)"])
def open_backend(request: pytest.FixtureRequest, tiny_model: Path) -> Open:
    config = config_for(tiny_model)

    def torch_learner(found: Path | None) -> Subject:
        learner = TorchLearner.load(config, torch.device("cpu"), found)
        return Subject(learner, learner.model)

    def verl_stand_in(found: Path | None) -> Subject:
        workers = CpuStandInWorkers(tiny_model, config.lr)
        return Subject(VerlBackend.open(config, workers, found), workers.model)

    return torch_learner if request.param == "torch" else verl_stand_in


def response_log_prob(model: PreTrainedModel, response: list[int]) -> float:
    """log π(response | PROMPT), summed over the response."""
    per_token = token_log_probs(model, PROMPT + response)
    return sum(per_token[len(PROMPT):])


def token_log_probs(model: PreTrainedModel, ids: list[int]) -> list[float]:
    """Each token's log-probability after the ones before it (0 for the first)."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].float()
    picked = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
    return [0.0, *picked.tolist()]


def good_vs_bad(model: PreTrainedModel, version: int = 0) -> list[TaskGroup]:
    """One task: GOOD rewarded, BAD not, both as if the policy had just sampled them (at `version`)."""
    def rollout(response: list[int], reward: float) -> RolloutSample:
        ids = PROMPT + response
        segment = Segment(token_ids=ids, loss_mask=[False] * len(PROMPT) + [True] * len(response),
                          logprobs=token_log_probs(model, ids), weight_versions=[version] * len(ids))
        return RolloutSample(rollout_id=f"x-{reward}", reward=reward, status="succeeded", segments=[segment])

    return [TaskGroup(group_id="x", run_id="run", task_id="x", group_size=2, created_at=T0,
                      rollouts=[rollout(GOOD, 1.0), rollout(BAD, 0.0)])]


def test_an_update_moves_the_policy_toward_the_advantage(open_backend: Open) -> None:
    torch.manual_seed(0)
    subject = open_backend(None)
    before_good, before_bad = response_log_prob(subject.policy, GOOD), response_log_prob(subject.policy, BAD)
    for _ in range(5):
        subject.backend.update(good_vs_bad(subject.policy), version=0)
    assert response_log_prob(subject.policy, GOOD) > before_good + 0.5
    assert response_log_prob(subject.policy, BAD) < before_bad - 0.5


def test_the_metrics_are_the_batchs_and_map_onto_a_trainer_step(open_backend: Open) -> None:
    subject = open_backend(None)
    metrics = subject.backend.update(good_vs_bad(subject.policy, version=0), version=2)
    assert (metrics.tokens, metrics.task_groups, metrics.optimizer_steps) == (6, 1, 1)  # 3 + 3 response tokens
    assert metrics.staleness_mean == metrics.staleness_max == 2.0  # sampled at version 0, trained at 2
    assert math.isfinite(metrics.loss) and metrics.grad_norm > 0 and metrics.seconds > 0

    record = UpdateRecord(version=3, metrics=metrics, mean_reward=0.5, dropped_stale=1, dropped_no_signal=2,
                          time=1.0)
    step = record.event("run")
    assert isinstance(step, TrainerStep)
    assert (step.version, step.task_groups, step.tokens, step.mean_reward) == (3, 1, 6, 0.5)
    assert (step.loss, step.grad_norm, step.staleness_max) == (metrics.loss, metrics.grad_norm, 2.0)
    assert (step.dropped_stale, step.dropped_no_signal, step.seconds) == (1, 2, metrics.seconds)
    row = record.row()  # the history row the checkpoint keeps and the plots read
    assert {k: row[k] for k in ("version", "tokens", "task_groups", "mean_reward", "time")} == {
        "version": 3.0, "tokens": 6.0, "task_groups": 1.0, "mean_reward": 0.5, "time": 1.0}
    assert row["loss"] == metrics.loss and row["seconds"] == metrics.seconds


def test_no_groups_is_no_update(open_backend: Open) -> None:
    subject = open_backend(None)
    before = response_log_prob(subject.policy, GOOD)
    assert subject.backend.update([], version=4) == UpdateMetrics()  # zeros: what the loop records for it
    assert response_log_prob(subject.policy, GOOD) == before


def test_a_committed_checkpoint_restores_the_weights_and_the_optimiser(open_backend: Open, tmp_path: Path) -> None:
    first = open_backend(None)
    first.backend.update(good_vs_bad(first.policy), version=0)
    state = TrainerState(version=1, offsets={"0": 7}, trained={"x": 1}, history=[{"version": 1.0}])
    staging = first.backend.stage(tmp_path, state)
    assert checkpoint.latest(tmp_path) is None  # staged is not committed
    final = checkpoint.commit(tmp_path, staging, 1)
    assert checkpoint.latest(tmp_path) == final and checkpoint.load_state(final) == state

    resumed, fresh = open_backend(final), open_backend(None)
    trained = response_log_prob(first.policy, GOOD)
    assert response_log_prob(resumed.policy, GOOD) == pytest.approx(trained, abs=1e-5)
    assert response_log_prob(fresh.policy, GOOD) != pytest.approx(trained, abs=1e-3)
    groups = good_vs_bad(first.policy)  # the same next batch for both: equal only if the optimiser came back
    first.backend.update(groups, version=1)
    resumed.backend.update(groups, version=1)
    assert response_log_prob(resumed.policy, GOOD) == pytest.approx(response_log_prob(first.policy, GOOD), abs=1e-4)
    assert response_log_prob(resumed.policy, BAD) == pytest.approx(response_log_prob(first.policy, BAD), abs=1e-4)
