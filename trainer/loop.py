"""The collocated async loop: B task groups → pause the gateways → update → new weights in the engine →
checkpoint → resume. Agents keep running between updates; it reads top to bottom.

    tether.samples ──► buffer ──B groups──► UpdateRequested{v+1} ──► GatewayDrained{v+1} from every gateway
        ──► update (torch) ──► engine loads v+1 ──► checkpoint (with the sample offsets) ──► TrainerStep,
        WeightVersionPublished{v+1} ──► gateways release held calls

On start it resumes from the latest checkpoint: the model, the optimiser, the
version, and the offsets of tether.samples just past the groups the last
update used. An update interrupted by a crash is settled first: if its
checkpoint was committed its version is published, otherwise it is aborted
and the engine gets the checkpoint's weights back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import torch
from aiokafka import TopicPartition
from transformers import AutoModelForCausalLM, PreTrainedModel

from schemas import topics
from schemas.consumer import CaughtUp, EventConsumer
from schemas.events import (
    Event,
    GatewayDrained,
    GatewayJoined,
    GatewayLeft,
    TaskGroup,
    TrainerStep,
    UpdateAborted,
    UpdateRequested,
    WeightVersionPublished,
    run_of,
)
from schemas.producer import EventProducer
from schemas.settings import BusSettings
from trainer import checkpoint
from trainer.algorithms import LossConfig
from trainer.batch import build_batch, select
from trainer.checkpoint import TrainerState
from trainer.config import TrainerConfig
from trainer.errors import DrainTimeout, EngineError
from trainer.step import StepConfig, update

log = logging.getLogger("tether.trainer")


@dataclass
class Control:
    """The run's side of tether.control as the trainer needs it: who must drain, who did, what is pending."""
    run_id: str
    members: set[str] = field(default_factory=set)
    drained: dict[int, set[str]] = field(default_factory=dict)
    requested: int = 0
    settled: int = 0  # the latest version published or aborted
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def apply(self, event: Event) -> None:
        if run_of(event) != self.run_id:
            return
        if isinstance(event, GatewayJoined):
            self.members.add(event.gateway_id)
        elif isinstance(event, GatewayLeft):
            self.members.discard(event.gateway_id)
        elif isinstance(event, GatewayDrained):
            self.drained.setdefault(event.version, set()).add(event.gateway_id)
        elif isinstance(event, UpdateRequested):
            self.requested = max(self.requested, event.version)
        elif isinstance(event, WeightVersionPublished | UpdateAborted):
            self.settled = max(self.settled, event.version)
        self.changed.set()

    @property
    def pending(self) -> int | None:
        return self.requested if self.requested > self.settled else None


def pick_device(choice: str) -> torch.device:
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(choice)


class Trainer:
    def __init__(self, config: TrainerConfig, bus: BusSettings,
                 on_update: Callable[[dict[str, float]], None] | None = None) -> None:
        self.config, self.bus, self.on_update = config, bus, on_update
        self.control = Control(config.run_id)
        self.device = pick_device(config.device)
        self._caught_up = asyncio.Event()

    # -- start-up ------------------------------------------------------------------

    def _load(self) -> tuple[PreTrainedModel, torch.optim.Optimizer, TrainerState, PreTrainedModel | None]:
        torch.manual_seed(self.config.seed)
        found = checkpoint.latest(self.config.run_dir)
        source = found or self.config.model
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32, attn_implementation="sdpa")
        model.to(self.device)  # type: ignore[arg-type]  # transformers' typing of .to rejects a device
        optimizer = torch.optim.AdamW(model.parameters(), lr=self.config.lr, weight_decay=self.config.weight_decay)
        state = TrainerState()
        if found is not None:
            optimizer.load_state_dict(torch.load(found / "optimizer.pt", map_location=self.device))
            state = checkpoint.load_state(found)
            log.info("resuming from %s (version %d)", found, state.version)
        reference = None
        if self.config.kl_coef > 0:
            reference = AutoModelForCausalLM.from_pretrained(self.config.model, dtype=torch.float32,
                                                             attn_implementation="sdpa")
            reference.to(self.device).eval()  # type: ignore[arg-type]
            reference.requires_grad_(False)
        return model, optimizer, state, reference

    async def _follow_control(self, producer: EventProducer) -> None:
        async with EventConsumer(self.bus, [topics.CONTROL], producer, name=f"trainer-{self.config.run_id}") as c:
            async for item in c.follow(timeout_ms=100):
                if isinstance(item, CaughtUp):
                    self._caught_up.set()
                else:
                    self.control.apply(item.event)

    async def _engine_load(self, engine: httpx.AsyncClient | None, folder: Path, version: int) -> None:
        if engine is None:
            return
        try:
            response = await engine.post("/v1/weights/load", json={"path": str(folder), "version": version})
        except httpx.HTTPError as exc:
            raise EngineError(f"engine {self.config.engine_url} unreachable: {exc!r}") from exc
        if response.status_code != 200:
            raise EngineError(f"engine refused version {version}: {response.status_code} {response.text[:300]}")

    async def _settle(self, producer: EventProducer, engine: httpx.AsyncClient | None, state: TrainerState) -> None:
        """An update a crash interrupted: publish it if its checkpoint was committed, else abort it."""
        pending = self.control.pending
        found = checkpoint.latest(self.config.run_dir)
        if found is not None:
            await self._engine_load(engine, found, state.version)  # the engine may hold a newer, uncommitted one
        if pending is None:
            return
        if pending == state.version:
            await producer.publish(WeightVersionPublished(run_id=self.config.run_id, version=state.version,
                                                          checkpoint_path=str(found)))
        else:
            await producer.publish(UpdateAborted(run_id=self.config.run_id, version=pending,
                                                 reason="the trainer restarted before committing this update"))

    # -- the loop ------------------------------------------------------------------

    async def run(self) -> TrainerState:
        model, optimizer, state, reference = await asyncio.to_thread(self._load)
        self.config.run_dir.mkdir(parents=True, exist_ok=True)
        step_config = StepConfig(self.config.temperature, self.config.max_grad_norm,
                                 rows_per_micro_batch=self.config.rows_per_micro_batch, epochs=self.config.epochs,
                                 mini_batches=self.config.mini_batches, loss=LossConfig(
            mode=self.config.loss_mode, clip_low=self.config.clip_low, clip_high=self.config.clip_high,
            is_cap=self.config.is_cap, kl_coef=self.config.kl_coef))
        engine = httpx.AsyncClient(base_url=self.config.engine_url, timeout=600) if self.config.engine_url else None
        async with EventProducer(self.bus, client_id=f"trainer-{self.config.run_id}") as producer:
            follower = asyncio.create_task(self._follow_control(producer))
            try:
                await self._caught_up.wait()
                await self._settle(producer, engine, state)
                if self._done(state):
                    return state
                async with EventConsumer(self.bus, [topics.SAMPLES], producer,
                                         name=f"trainer-{self.config.run_id}") as samples:
                    for tp in list(samples.assignment()):
                        samples.seek(tp, state.offsets.get(str(tp.partition), 0))
                    await self._consume(samples, producer, engine, model, optimizer, state, reference, step_config)
            finally:
                follower.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await follower
                if engine is not None:
                    await engine.aclose()
        return state

    async def _consume(self, samples: EventConsumer, producer: EventProducer, engine: httpx.AsyncClient | None,
                       model: PreTrainedModel, optimizer: torch.optim.Optimizer, state: TrainerState,
                       reference: PreTrainedModel | None, step_config: StepConfig) -> None:
        buffer: list[tuple[TaskGroup, TopicPartition, int]] = []
        queued: set[str] = set()
        async for batch in samples.batches(timeout_ms=200):
            for received in batch:
                group = received.event
                if not isinstance(group, TaskGroup) or group.run_id != self.config.run_id:
                    continue
                if group.group_id in state.trained or group.group_id in queued:
                    continue  # a repeat (the processors deliver at least once): trained or queued already
                queued.add(group.group_id)
                buffer.append((group, TopicPartition(received.topic, received.partition), received.offset))
            while len(buffer) >= self.config.batch_groups:
                taken, buffer = buffer[:self.config.batch_groups], buffer[self.config.batch_groups:]
                for _, tp, offset in taken:  # resume just past what this update used
                    state.offsets[str(tp.partition)] = max(state.offsets.get(str(tp.partition), 0), offset + 1)
                await self._update(producer, engine, model, optimizer, state, reference, step_config,
                                   [g for g, _, _ in taken])
                queued.difference_update(g.group_id for g, _, _ in taken)
                if self._done(state):
                    return

    def _done(self, state: TrainerState) -> bool:
        return self.config.max_updates is not None and len(state.history) >= self.config.max_updates

    async def _update(self, producer: EventProducer, engine: httpx.AsyncClient | None, model: PreTrainedModel,
                      optimizer: torch.optim.Optimizer, state: TrainerState, reference: PreTrainedModel | None,
                      step_config: StepConfig, groups: list[TaskGroup]) -> None:
        version = state.version + 1
        chosen = select(groups, state.version, self.config.max_staleness, self.config.zero_variance)
        rewards = [r.reward for g in groups for r in g.rollouts]
        await producer.publish(UpdateRequested(run_id=self.config.run_id, version=version,
                                               n_task_groups=len(chosen.groups)))
        await self._wait_drained(producer, version)
        if chosen.groups:
            batch = build_batch(chosen.groups, self.config.row_tokens, normalise_by_std=self.config.normalise_by_std,
                                mode=self.config.loss_mode)
            metrics = await asyncio.to_thread(update, model, optimizer, batch, step_config, state.version, reference)
        else:  # nothing to learn from: the version still advances, so the record stays one update per batch
            metrics = {k: 0.0 for k in ("loss", "entropy", "clip_fraction", "kl", "grad_norm", "tokens",
                                        "staleness_mean", "staleness_max", "seconds")}
        metrics.update(version=float(version), mean_reward=sum(rewards) / max(len(rewards), 1),
                       task_groups=float(len(chosen.groups)), dropped_stale=float(chosen.stale),
                       dropped_no_signal=float(chosen.no_signal), time=time.time())
        state.version = version
        state.history.append(metrics)
        for g in groups:
            state.trained[g.group_id] = version
        staging = await asyncio.to_thread(checkpoint.stage, self.config.run_dir, model, optimizer, state)
        await self._engine_load(engine, staging, version)
        final = await asyncio.to_thread(checkpoint.commit, self.config.run_dir, staging, version)
        await producer.publish(TrainerStep(
            run_id=self.config.run_id, version=version, task_groups=len(chosen.groups), tokens=int(metrics["tokens"]),
            mean_reward=metrics["mean_reward"], loss=metrics["loss"], entropy=metrics["entropy"],
            clip_fraction=metrics["clip_fraction"], kl=metrics["kl"], grad_norm=metrics["grad_norm"],
            staleness_mean=metrics["staleness_mean"], staleness_max=metrics["staleness_max"],
            dropped_stale=chosen.stale, dropped_no_signal=chosen.no_signal, seconds=metrics["seconds"]))
        await producer.publish(WeightVersionPublished(run_id=self.config.run_id, version=version,
                                                      checkpoint_path=str(final)))
        log.info("version %d: %d task groups, loss %.4f, mean reward %.3f", version, len(chosen.groups),
                 metrics["loss"], metrics["mean_reward"])
        if self.on_update is not None:
            self.on_update(metrics)

    async def _wait_drained(self, producer: EventProducer, version: int) -> None:
        deadline = time.monotonic() + self.config.drain_timeout_s
        while True:
            missing = self.control.members - self.control.drained.get(version, set())
            if not missing:
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                await producer.publish(UpdateAborted(run_id=self.config.run_id, version=version,
                                                     reason=f"gateways {sorted(missing)} did not drain"))
                raise DrainTimeout(f"gateways {sorted(missing)} did not report GatewayDrained for version "
                                   f"{version} within {self.config.drain_timeout_s:.0f} s; update aborted")
            self.control.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.control.changed.wait(), remaining)
