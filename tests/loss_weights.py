"""Each trainable token's weight in the final loss, read off the two update backends' own gradients.

Every rollout is given advantage 1 (a `ScoredGroups` of ones) and every policy gives every token the same
log-probability LP0, which is also its behaviour log-prob, so ratio and importance weight are 1 and the scalar an
optimiser step descends is L = -Σ_t c_t·ratio_t: ∂L/∂log π(t) = -c_t, the token's coefficient in the loss.

- torch: `TorchLearner.update` on a stand-in model that is one bias vector over the vocabulary (`BiasModel`).
- verl: `VerlBackend.update` and `VerlWorkers.update` on a stand-in worker group that runs `workers.tether_loss`
  as verl's engine runs a loss (`StandInGroup`), without Ray.

Trainable token ids are unique in a batch, so a coefficient is keyed by its token's id. Used by
tests/test_trainer_divisor.py.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import torch
from tensordict import TensorDict
from transformers import PreTrainedModel
from verl.utils import tensordict_utils as tu
from verl.workers.utils.padding import no_padding_2_padding

from schemas.events import TaskGroup
from trainer.advantages import Given, ScoredGroups
from trainer.algorithms import LossConfig, LossMode
from trainer.config import TrainerConfig
from trainer.learner import TorchLearner
from trainer.verl.backend import VerlBackend
from trainer.verl.workers import MICRO_BATCH, VerlWorkers, tether_loss

VOCAB = 512
UNUSED = VOCAB - 1  # no segment holds it: the bias model's gradient there is Σc/V
LP0 = float(torch.log_softmax(torch.zeros(VOCAB), -1)[0])  # every token's log-prob under the stand-in policies

Weights = dict[int, float]  # trainable token id -> its coefficient in one optimiser step's loss


@dataclass(frozen=True)
class Where:
    group: int
    rollout: tuple[int, int]
    segment: tuple[int, int, int]


def trainable(groups: list[TaskGroup]) -> dict[int, Where]:
    """Every trainable target (position i of a segment predicts token i+1; a segment's first token is none)."""
    out: dict[int, Where] = {}
    for g, group in enumerate(groups):
        for r, rollout in enumerate(group.rollouts):
            for s, segment in enumerate(rollout.segments):
                for y, m in zip(segment.token_ids[1:], segment.loss_mask[1:], strict=True):
                    if m:
                        assert y not in out
                        out[y] = Where(g, (g, r), (g, r, s))
    return out


def config(mode: LossMode, **knobs: Any) -> TrainerConfig:
    return TrainerConfig(run_id="divisor", model=Path("stand-in"), loss_mode=mode, max_grad_norm=1e9, **knobs)


def unit(groups: list[TaskGroup]) -> ScoredGroups:
    """Advantage 1 for every rollout: the loss is linear in each token's coefficient."""
    return ScoredGroups(groups, [[Given(1.0, {})] * len(g.rollouts) for g in groups])


class BiasModel(torch.nn.Module):
    """The stand-in policy: logits are one bias vector, whatever the context (log π = LP0 at zero)."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = torch.nn.Parameter(torch.zeros(VOCAB))

    def forward(self, input_ids: torch.Tensor, **_: Any) -> SimpleNamespace:
        return SimpleNamespace(logits=self.bias.expand(*input_ids.shape, VOCAB).contiguous())


def torch_steps(groups: list[TaskGroup], c: TrainerConfig) -> list[Weights]:
    """Each optimiser step of the torch learner's update, as every trainable token's coefficient."""
    model = BiasModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # the policy stays at LP0: π_prox = π_θ = π_b
    grads: list[torch.Tensor] = []

    def record(*_: Any) -> None:
        assert model.bias.grad is not None
        grads.append(model.bias.grad.detach().clone())

    optimizer.register_step_pre_hook(record)
    learner = TorchLearner(config=c, model=cast(PreTrainedModel, model), optimizer=optimizer)
    metrics = learner.update(unit(groups), version=0)
    assert metrics.optimizer_steps == len(grads)
    ids = trainable(groups)
    return [{y: float(g[UNUSED] - g[y]) for y in ids} for g in grads]


class StandInGroup:
    """verl's actor worker group as `VerlWorkers` calls it, without Ray, doing what verl 0.9.1 does with what it is
    handed: the dispatch gives the ranks contiguous shares of the rows; `train_mini_batch` cuts each share into
    mini-batches of `mini_batch_size // ranks` rows, in order (shuffle off), for `epochs`; the FSDP engine sums
    `loss_mask` (the response mask) over the global mini-batch as `batch_num_tokens`, runs the loss on micro-batches
    of MICRO_BATCH rows and averages the ranks' gradients; `train_batch` steps the optimiser once per mini-batch.
    Records each step's coefficients, and how many trainable tokens its mini-batch held."""

    def __init__(self, world_size: int, loss: LossConfig) -> None:
        self.world_size, self.loss = world_size, loss
        self.steps: list[Weights] = []
        self.tokens: list[int] = []

    def compute_log_prob(self, td: TensorDict) -> TensorDict:
        values = torch.full((int(td["input_ids"].values().numel()),), LP0)
        out: TensorDict = tu.get_tensordict(tensor_dict={
            "log_probs": torch.nested.nested_tensor_from_jagged(values, offsets=td["input_ids"].offsets())})
        return out

    def update_actor(self, td: TensorDict) -> TensorDict:
        assert tu.get(td, "dataloader_kwargs") == {"shuffle": False}
        per_rank = int(tu.get(td, "mini_batch_size")) // self.world_size
        shares = tu.chunk_tensordict(td, self.world_size)
        minis = [tu.chunk_tensordict(share, len(share) // per_rank) for share in shares]
        for _ in range(int(tu.get(td, "epochs"))):
            for j in range(len(minis[0])):
                parts = [rank[j] for rank in minis]
                tokens = int(sum(int(part["loss_mask"].sum()) for part in parts))
                step: Weights = defaultdict(float)
                for part in parts:
                    for micro in tu.chunk_tensordict(part, len(part) // MICRO_BATCH):
                        tu.assign_non_tensor(micro, batch_num_tokens=tokens, dp_size=self.world_size)
                        grad = self._gradient(micro)
                        mask, responses = micro["response_mask"], micro["responses"]
                        assert torch.all(grad[mask == 0] == 0)
                        for i, p in (mask > 0).nonzero().tolist():
                            step[int(responses[i, p])] -= float(grad[i, p]) / self.world_size
                self.steps.append(dict(step))
                self.tokens.append(tokens)
        out: TensorDict = tu.get_tensordict(tensor_dict={}, non_tensor_dict={
            "metrics": {"grad_norm": [1.0] * len(self.steps)}})
        return out

    def _gradient(self, micro: TensorDict) -> torch.Tensor:
        """∂(this rank's loss)/∂log π of each response token, (rows, response length)."""
        values = torch.full((int(micro["input_ids"].values().numel()),), LP0, requires_grad=True)
        log_probs = torch.nested.nested_tensor_from_jagged(values, offsets=micro["input_ids"].offsets())
        loss, _ = tether_loss({"log_probs": log_probs}, micro, loss=self.loss)
        loss.backward()
        assert values.grad is not None
        grad: torch.Tensor = no_padding_2_padding(values.grad, micro)
        return grad


def verl_run(groups: list[TaskGroup], c: TrainerConfig) -> StandInGroup:
    """`VerlBackend.update` through the real `VerlWorkers.update` and `log_probs`, on a stand-in worker group."""
    group = StandInGroup(c.workers, LossConfig(mode=c.loss_mode, clip_low=c.clip_low, clip_high=c.clip_high,
                                               is_cap=c.is_cap))
    workers = VerlWorkers.__new__(VerlWorkers)  # no Ray: what `VerlWorkers.__init__` would set, with the stand-in
    workers.config, workers.world_size, workers.rows_multiple = c, c.workers, c.workers * MICRO_BATCH
    workers.group = group
    VerlBackend(c, workers).update(unit(groups), version=0)
    return group


def verl_steps(groups: list[TaskGroup], c: TrainerConfig) -> list[Weights]:
    """Each optimiser step of the verl backend's update, as every trainable token's coefficient."""
    ids = trainable(groups)
    return [{y: step.get(y, 0.0) for y in ids} for step in verl_run(groups, c).steps]


def one_step(steps: list[Weights]) -> Weights:
    assert len(steps) == 1
    return steps[0]
