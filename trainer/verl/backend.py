"""The verl backend (`backend: verl`): the same task groups, trained by verl's own FSDP workers on Ray.

The loop in `trainer/loop.py` stays as it is; only the update changes hands
(an `UpdateBackend`, see `trainer/backend.py`). Each batch of task groups
becomes verl's multi-turn layout, one row per segment: the opening prompt
(left-padded) and everything after it as the "response", with
`response_mask` off on the gaps (tool output, user turns);
`behaviour_log_probs` are the logprobs the gateway recorded, `advantages`
the task-level ones and `token_weights` the normalisation of per-task and
seq-mean-token-mean, counted per optimiser step (verl's own divisor of
seq-mean-token-mean is one number for every mini-batch and counts filler
rows). Mini-batches are runs of the segments that train, in order, as the
torch learner cuts its rows; none of them is filler rows only, so verl (which
steps the optimiser on every mini-batch it is given) takes no step on nothing.
The workers (`trainer/verl/workers.py`) apply Tether's loss to it, so both
backends optimise the same objective. After an update the checkpoint holds
the weights as a Hugging Face folder (what the inference engines load) and
the workers' sharded checkpoint under `actor/`.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from pathlib import Path
from typing import Any, Protocol

import torch
from verl import DataProto

from trainer import checkpoint, lora
from trainer.advantages import ScoredGroups
from trainer.algorithms import LossMode
from trainer.batch import Piece, pieces
from trainer.checkpoint import TrainerState
from trainer.config import TrainerConfig
from trainer.engines.broadcast import Sender
from trainer.errors import UpdateFailed, WorkersLost
from trainer.metrics import UpdateMetrics
from trainer.verl.weights import WeightWorkers, WorkerSender

log = logging.getLogger("tether.trainer.verl")


def to_verl(scored: ScoredGroups, config: TrainerConfig, pad_id: int = 0, rows_multiple: int = 1,
            world_size: int = 1) -> DataProto:
    """One verl sample per segment that trains: (prompt, response) with masks, behaviour logprobs, advantages and
    weights, in `config.mini_batches` mini-batches (fewer if there are fewer segments), each filled up to a multiple
    of `rows_multiple` (workers times rows per forward) with copies that train nothing."""
    return _rows(_mini_batches(pieces(scored, config.loss_mode), config), config, world_size, rows_multiple, pad_id)


def _trained(laid: list[Piece], mode: LossMode) -> list[Piece]:
    """The segments with a trainable token (a row of the others trains nothing, and costs a forward). In
    seq-mean-token-mean each weighs 1/S, spread evenly over its T tokens: the workers sum token weights in that mode
    as in per-task, and each mini-batch's are scaled to its own S (`_scale_mini_batches`)."""
    live = [p for p in laid if any(p.mask)]
    if mode != "seq-mean-token-mean":
        return live
    return [dataclasses.replace(p, weight=1.0 / (len(live) * sum(p.mask))) for p in live]


def _mini_batches(laid: list[Piece], config: TrainerConfig) -> list[list[Piece]]:
    """The trained segments in order, in runs of ⌈n/M⌉ as the torch learner cuts its rows: every run has a token to
    train. Empty when nothing does."""
    live = _trained(laid, config.loss_mode)
    size = max(1, -(-len(live) // config.mini_batches))
    return [live[i:i + size] for i in range(0, len(live), size)]


def _rows(runs: list[list[Piece]], config: TrainerConfig, world_size: int, rows_multiple: int,
          pad_id: int = 0) -> DataProto:
    """The mini-batches as verl cuts them: worker w gets a contiguous share of the rows and takes its part of each
    mini-batch from it in order. Each mini-batch is dealt evenly to the workers and filled to the same number of
    rows, so that a worker's micro-batches hold real rows where there are enough."""
    longest = max(len(run) for run in runs)
    per_worker = -(-longest // rows_multiple) * rows_multiple // world_size
    filler = _filler(min((p for run in runs for p in run), key=lambda p: len(p.tokens)))  # the cheapest forward
    dealt = [_dealt(run, world_size) for run in runs]
    rows: list[Piece] = []
    for w in range(world_size):
        for parts in dealt:
            rows += parts[w] + [filler] * (per_worker - len(parts[w]))
    batch = _layout(rows, config.temperature, pad_id)
    if config.loss_mode != "token-mean" and len(runs) > 1:
        _scale_mini_batches(batch.batch, world_size, len(runs))
    return batch


def _dealt(run: list[Piece], parts: int) -> list[list[Piece]]:
    """`run` in `parts` pieces in order, their lengths differing by one at most."""
    size, extra = divmod(len(run), parts)
    bounds = [k * size + min(k, extra) for k in range(parts + 1)]
    return [run[a:b] for a, b in itertools.pairwise(bounds)]


def _filler(piece: Piece) -> Piece:
    """A row that trains nothing, shaped like `piece` (verl has no empty sequence)."""
    return dataclasses.replace(piece, mask=[0.0] * len(piece.mask), weight=0.0)


def _layout(laid: list[Piece], temperature: float, pad_id: int = 0) -> DataProto:
    # the first trainable target; a row with none (a filler) keeps its last target as a masked response
    firsts = [next((i for i, m in enumerate(p.mask) if m), len(p.mask) - 1) for p in laid]
    prompts = [p.tokens[:first + 1] for p, first in zip(laid, firsts, strict=True)]
    prompt_len = max(len(x) for x in prompts)
    response_len = max(len(p.tokens) - first for p, first in zip(laid, firsts, strict=True))
    n = len(laid)
    t = {"prompts": torch.full((n, prompt_len), pad_id), "responses": torch.full((n, response_len), pad_id),
         "response_mask": torch.zeros(n, response_len), "behaviour_log_probs": torch.zeros(n, response_len),
         "advantages": torch.zeros(n, response_len), "token_weights": torch.zeros(n, response_len),
         "attention_mask": torch.zeros(n, prompt_len + response_len, dtype=torch.long)}
    for i, (p, first) in enumerate(zip(laid, firsts, strict=True)):
        prompt = prompts[i]
        t["prompts"][i, prompt_len - len(prompt):] = torch.tensor(prompt)  # left-padded, as verl's rollouts are
        # targets[first:] are the tokens after the prompt: the "response" verl scores, gaps masked out
        response = p.targets[first:]
        span = slice(0, len(response))
        t["responses"][i, span] = torch.tensor(response)
        t["response_mask"][i, span] = torch.tensor(p.mask[first:])
        t["behaviour_log_probs"][i, span] = torch.tensor(p.behaviour[first:])
        t["advantages"][i, span] = torch.tensor(p.advantages[first:])
        t["token_weights"][i, span] = p.weight
        t["attention_mask"][i, prompt_len - len(prompt):prompt_len + len(response)] = 1
    t["input_ids"] = torch.cat([t["prompts"], t["responses"]], dim=1)
    t["position_ids"] = (torch.cumsum(t["attention_mask"], dim=1) - 1).clamp(min=0)
    batch: DataProto = DataProto.from_dict(tensors=t, meta_info={"temperature": temperature})
    return batch


class ActorWorkers(WeightWorkers, Protocol):
    """What the backend uses of verl's actor workers (`trainer/verl/workers.VerlWorkers`)."""

    world_size: int
    rows_multiple: int  # rows per mini-batch must be a multiple of this (workers times rows per forward)

    def log_probs(self, batch: DataProto) -> torch.Tensor: ...

    def update(self, batch: DataProto, mini_batches: int, epochs: int) -> dict[str, Any]: ...

    def export_weights(self, folder: Path) -> None: ...

    def save_checkpoint(self, folder: Path, step: int) -> None: ...

    def load_checkpoint(self, folder: Path) -> None: ...

    def restart(self, found: Path | None) -> None: ...

    def stop(self) -> None: ...

    def close(self) -> None: ...


def mean_of(value: Any) -> float:
    """verl reports a metric as a number, or a list of them (one per mini-batch or rank)."""
    if isinstance(value, list):
        return float(sum(value) / len(value)) if value else 0.0
    return float(value)


ACTOR = "actor"  # the checkpoint's subfolder for the workers' sharded weights and optimiser


class VerlBackend:
    """An `UpdateBackend` on verl's FSDP workers. Checkpoints hold the workers' own (sharded) checkpoint under
    `actor/`, so the run's checkpoint folder must be on storage every node sees."""

    def __init__(self, config: TrainerConfig, workers: ActorWorkers) -> None:
        self.config, self.workers = config, workers
        self.base_digest: str | None = None  # with lora: the base's, written with every checkpoint

    @classmethod
    def open(cls, config: TrainerConfig, workers: ActorWorkers, found: Path | None) -> VerlBackend:
        """The backend, with the workers restored from the checkpoint `found` if there is one."""
        if found is not None:
            if config.lora is not None:
                lora.check_base(found, config.model)
            workers.load_checkpoint(found / ACTOR)
        return cls(config, workers)

    def update(self, scored: ScoredGroups, version: int) -> UpdateMetrics:
        try:
            return self._update(scored, version)
        except WorkersLost as exc:  # a worker died: the others are stuck in the process group with it
            found = checkpoint.latest(self.config.run_dir)
            log.warning("update of version %d failed (%s); restarting the workers from %s", version + 1, exc,
                        found or self.config.model)
            self.workers.restart(found / ACTOR if found else None)
            raise UpdateFailed(f"the update of version {version + 1} failed and was not applied: {exc}") from exc

    def _update(self, scored: ScoredGroups, version: int) -> UpdateMetrics:
        started = time.perf_counter()
        c = self.config
        runs = _mini_batches(pieces(scored, c.loss_mode), c)
        if not runs:
            return UpdateMetrics()
        batch = _rows(runs, c, self.workers.world_size, self.workers.rows_multiple)
        t = batch.batch
        if c.epochs * c.mini_batches > 1:  # π_prox: the policy before the first step, as the torch learner takes it
            t["prox_log_probs"] = self.workers.log_probs(batch)
        reported = self.workers.update(batch, len(runs), c.epochs)
        mask = t["response_mask"] > 0
        stale = [version - v for g in scored.groups for r in g.rollouts for s in r.segments
                 for v, m in zip(s.weight_versions[1:], s.loss_mask[1:], strict=True) if m]
        norms = reported.get("grad_norm", reported.get("actor/grad_norm", []))
        return UpdateMetrics(
            loss=mean_of(reported.get("actor/pg_loss", 0.0)), entropy=mean_of(reported.get("actor/entropy", 0.0)),
            clip_fraction=mean_of(reported.get("actor/pg_clipfrac", 0.0)),
            is_weight_mean=mean_of(reported.get("actor/is_weight_mean", 0.0)), grad_norm=mean_of(norms),
            optimizer_steps=len(norms) if isinstance(norms, list) else 1, tokens=int(mask.sum()),
            task_groups=len(scored.groups), staleness_mean=sum(stale) / len(stale) if stale else 0.0,
            staleness_max=float(max(stale, default=0)), seconds=time.perf_counter() - started)

    def stage(self, root: Path, state: TrainerState) -> Path:
        def write(folder: Path) -> None:
            self.workers.export_weights(folder)  # a Hugging Face folder, or an adapter: what the engines load
            if self.config.lora is not None:
                lora.write_base(folder, self.config.model, self._digest())
            self.workers.save_checkpoint(folder / ACTOR, state.version)

        return checkpoint.stage(root, state, write)

    def _digest(self) -> str:
        if self.base_digest is None:
            self.base_digest = lora.base_digest(self.config.model)
        return self.base_digest

    def weight_sender(self, kind: str) -> Sender:
        return WorkerSender(kind, self.workers)  # each bucket gathered by the workers, broadcast by the first

    def close(self) -> None:
        self.workers.close()


def _scale_mini_batches(t: Any, world_size: int, mini_batches: int) -> None:
    """Per-task (and here seq-mean-token-mean) weights sum to 1 over the batch; each optimiser step sees one
    mini-batch, so its weights are scaled back to that mass, as the torch learner does per-task (in
    seq-mean-token-mean each segment then weighs 1/S of its own mini-batch's S). verl gives each worker a contiguous
    share of the rows and each worker takes its mini-batches from its share in order."""
    rows = t["token_weights"].shape[0]
    share, per_mini = rows // world_size, rows // world_size // mini_batches
    mass = (t["token_weights"] * t["response_mask"]).sum(-1)
    total = float(mass.sum())
    for j in range(mini_batches):
        members = [w * share + j * per_mini + i for w in range(world_size) for i in range(per_mini)]
        part = float(mass[members].sum())
        if part > 0:
            t["token_weights"][members] *= total / part
