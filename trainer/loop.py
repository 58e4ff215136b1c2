"""The collocated async loop: B task groups → pause the gateways → update → new weights in the engine →
checkpoint → resume. Agents keep running between updates; it reads top to bottom.

    tether.samples ──► buffer ──B groups──► UpdateRequested{v+1} ──► GatewayDrained{v+1} from every gateway
        ──► update (the backend) ──► engine loads v+1 ──► checkpoint (with the sample offsets) ──► TrainerStep,
        WeightVersionPublished{v+1} ──► gateways release held calls

The update itself is the backend's (`trainer/backend.py`: the embedded torch
learner, or verl's workers); the loop owns the handshake, the batches and the
commit. On start it resumes from the latest checkpoint: the weights, the
optimiser, the version, and the offsets of tether.samples just past the
groups the last update used. An update interrupted by a crash is settled
first: if its checkpoint was committed its version is published, otherwise it
is aborted and the engine gets the checkpoint's weights back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from aiokafka import TopicPartition

from schemas import topics
from schemas.consumer import CaughtUp, EventConsumer
from schemas.events import (
    Event,
    GatewayDrained,
    GatewayJoined,
    GatewayLeft,
    TaskGroup,
    UpdateAborted,
    UpdateRequested,
    ValidationReported,
    ValidationStarted,
    WeightVersionPublished,
    run_of,
)
from schemas.producer import EventProducer
from schemas.settings import BusSettings
from trainer import checkpoint
from trainer.advantages import ScoredGroups
from trainer.backend import UpdateBackend, open_backend
from trainer.checkpoint import TrainerState
from trainer.config import TrainerConfig
from trainer.engines.fleet import EngineFleet
from trainer.errors import DrainTimeout, EngineError, UpdateFailed
from trainer.learner import pick_device
from trainer.metrics import UpdateRecord
from trainer.selection import Verdict, batch_size, select, verdict
from trainer.tracking import Timing, Tracker, open_tracking, scalars, validation_scalars

log = logging.getLogger("tether.trainer")
UPDATE_ATTEMPTS = 3  # of one batch, when the backend loses its workers
FINAL_ROUND_START_S = 60.0  # for the controller to start the last version's validation round


@dataclass(kw_only=True)
class Control:
    """The run's side of tether.control as the trainer needs it: who must drain, who did, what is pending.

    A gateway is a member from its GatewayJoined, which it repeats as a heartbeat, until its GatewayLeft. One
    killed without a word is recognised by its silence: `silent` names members not heard from for a lease."""

    run_id: str
    members: dict[str, float] = field(default_factory=dict)  # gateway id -> when last heard (`clock`)
    drained: dict[int, set[str]] = field(default_factory=dict)
    requested: int = 0
    settled: int = 0  # the latest version published or aborted
    open: bool = False  # the latest request is not settled yet
    validating: set[int] = field(default_factory=set)  # versions whose validation round is out
    validated: dict[int, ValidationReported] = field(default_factory=dict)  # and those reported
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    clock: Callable[[], float] = time.monotonic

    def apply(self, event: Event) -> None:
        if run_of(event) != self.run_id:
            return
        if isinstance(event, GatewayJoined):
            self.members[event.gateway_id] = self.clock()
        elif isinstance(event, GatewayLeft):
            self.members.pop(event.gateway_id, None)
        elif isinstance(event, GatewayDrained):
            self.drained.setdefault(event.version, set()).add(event.gateway_id)
            if event.gateway_id in self.members:
                self.members[event.gateway_id] = self.clock()
        elif isinstance(event, UpdateRequested):
            self.requested = max(self.requested, event.version)
            self.open = True
        elif isinstance(event, WeightVersionPublished | UpdateAborted):
            self.settled = max(self.settled, event.version)
            self.open = self.open and self.settled < self.requested
        elif isinstance(event, ValidationStarted):
            self.validating.add(event.version)
        elif isinstance(event, ValidationReported):
            self.validated.setdefault(event.version, event)
        self.changed.set()

    def validation_pending(self, version: int) -> bool:
        """The controller is validating `version`: its calls must all be served by it."""
        return version in self.validating and version not in self.validated

    @property
    def pending(self) -> int | None:
        """The version requested and not yet published or aborted (an aborted one may be requested again)."""
        return self.requested if self.open else None

    def missing(self, version: int) -> set[str]:
        """Members that have not drained for `version`."""
        return set(self.members) - self.drained.get(version, set())

    def silent(self, lease_s: float) -> dict[str, float]:
        """Members not heard from for over `lease_s`, with how long they have been silent."""
        now = self.clock()
        return {g: now - heard for g, heard in self.members.items() if now - heard > lease_s}


@dataclass(kw_only=True)
class Session:
    """What one `Trainer.run` holds open, handed to its steps as one value."""
    backend: UpdateBackend
    state: TrainerState
    producer: EventProducer
    engine: EngineFleet | None
    tracker: Tracker | None = None
    idle_since: float = field(default_factory=time.monotonic)  # the last update's end: agents at work since


class Trainer:
    """The loop of one run. Without a `backend` it opens the one the config names (`open_backend`); a given
    backend must already hold the latest checkpoint's weights. `on_update` gets each update's history row."""

    def __init__(self, config: TrainerConfig, bus: BusSettings,
                 on_update: Callable[[dict[str, float]], None] | None = None, *,
                 backend: UpdateBackend | None = None) -> None:
        self.config, self.bus, self.on_update, self.backend = config, bus, on_update, backend
        self.control = Control(run_id=config.run_id)
        self.device = pick_device(config.device)
        self._caught_up = asyncio.Event()
        self._tracker: Tracker | None = None  # validation rounds are logged as they are reported

    # -- start-up ------------------------------------------------------------------

    def _open(self) -> tuple[UpdateBackend, TrainerState]:
        found = checkpoint.latest(self.config.run_dir)
        backend = self.backend or open_backend(self.config, self.device, found)
        state = TrainerState()
        if found is not None:
            state = checkpoint.load_state(found)
            log.info("resuming from %s (version %d)", found, state.version)
        return backend, state

    async def _follow_control(self, producer: EventProducer) -> None:
        async with EventConsumer(self.bus, [topics.CONTROL], producer, name=f"trainer-{self.config.run_id}") as c:
            async for item in c.follow(timeout_ms=100):
                if isinstance(item, CaughtUp):
                    self._caught_up.set()
                    continue
                event = item.event
                # reported while this trainer runs (a restart does not log the earlier rounds twice)
                fresh = (isinstance(event, ValidationReported) and event.version not in self.control.validated
                         and self._caught_up.is_set())
                self.control.apply(event)
                if fresh and self._tracker is not None and run_of(event) == self.config.run_id:
                    assert isinstance(event, ValidationReported)
                    self._tracker.log(validation_scalars(event), step=event.version)

    async def _settle(self, run: Session) -> None:
        """An update a crash interrupted: publish it if its checkpoint was committed, else abort it."""
        pending = self.control.pending
        if run.engine is not None:  # a replica may hold a newer, uncommitted version, or restarted on its launch one
            await run.engine.bring_up(*self._committed(), settle=True)
        found = checkpoint.latest(self.config.run_dir)
        if pending is None:
            return
        if pending == run.state.version:
            await run.producer.publish(WeightVersionPublished(run_id=self.config.run_id, version=run.state.version,
                                                              checkpoint_path=str(found),
                                                              final=self._done(run.state),
                                                              adapter=self.config.lora is not None))
        else:
            await run.producer.publish(UpdateAborted(run_id=self.config.run_id, version=pending,
                                                     reason="the trainer restarted before committing this update"))

    # -- the loop ------------------------------------------------------------------

    async def run(self) -> TrainerState:
        backend, state = await asyncio.to_thread(self._open)
        self.config.run_dir.mkdir(parents=True, exist_ok=True)
        engine = self._fleet(backend)
        tracker = await asyncio.to_thread(open_tracking, self.config) if self.config.logger else None
        self._tracker = tracker
        async with EventProducer(self.bus, client_id=f"trainer-{self.config.run_id}") as producer:
            run = Session(backend=backend, state=state, producer=producer, engine=engine, tracker=tracker)
            follower = asyncio.create_task(self._follow_control(producer))
            watcher: asyncio.Task[None] | None = None
            try:
                await self._caught_up.wait()
                await self._settle(run)
                if engine is not None:
                    watcher = asyncio.create_task(engine.watch(self._committed))
                if not self._done(state):
                    await self._train(run)
                await self._final_validation(run.state)
            finally:
                for task in (follower, watcher):
                    if task is not None:
                        task.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await task
                if engine is not None:
                    await engine.aclose()
                if tracker is not None:
                    tracker.finish()
                if self.backend is None:  # the loop opened it
                    await asyncio.to_thread(run.backend.close)
        return run.state

    def _fleet(self, backend: UpdateBackend) -> EngineFleet | None:
        """The engine replicas; over a weight group, the backend sends from where it holds the weights."""
        config = self.config.engine
        if config is None:
            return None
        return EngineFleet(config, sender=backend.weight_sender(config.kind) if config.transfer == "distributed"
                           else None)

    async def _train(self, run: Session) -> None:
        async with EventConsumer(self.bus, [topics.SAMPLES], run.producer,
                                 name=f"trainer-{self.config.run_id}") as samples:
            for tp in list(samples.assignment()):
                samples.seek(tp, run.state.offsets.get(str(tp.partition), 0))
            await self._consume(samples, run)

    async def _consume(self, samples: EventConsumer, run: Session) -> None:
        state = run.state
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
            while (size := self._batch_size(buffer, state.version)) is not None:
                taken, buffer = buffer[:size], buffer[size:]
                for _, tp, offset in taken:  # resume just past what this update used
                    state.offsets[str(tp.partition)] = max(state.offsets.get(str(tp.partition), 0), offset + 1)
                await self._update_retrying(run, [g for g, _, _ in taken])
                queued.difference_update(g.group_id for g, _, _ in taken)
                if self._done(state):
                    return

    def _batch_size(self, buffer: list[tuple[TaskGroup, TopicPartition, int]], version: int) -> int | None:
        """How many buffered groups the next update takes (`trainer.selection.batch_size`); None: wait."""
        config = self.config
        cap = config.fill_cap
        verdicts: list[Verdict] = [verdict(g, version, config.max_staleness, config.advantage)
                                   for g, _, _ in buffer[:cap]] if config.fill == "signal" else ["train"] * len(buffer)
        return batch_size(verdicts, config.batch_groups, config.fill, cap)

    def _done(self, state: TrainerState) -> bool:
        return self.config.max_updates is not None and len(state.history) >= self.config.max_updates

    async def _update_retrying(self, run: Session, groups: list[TaskGroup]) -> None:
        """An update the backend could not apply (it lost its workers, and is back from the checkpoint) is
        aborted, so the gateways resume, and requested again with the same groups."""
        for attempt in range(1, UPDATE_ATTEMPTS + 1):
            try:
                return await self._update(run, groups)
            except UpdateFailed as exc:
                version = run.state.version + 1
                await run.producer.publish(UpdateAborted(run_id=self.config.run_id, version=version,
                                                         reason=str(exc)[:2000]))
                self.control.drained.pop(version, None)  # the next request needs drains of its own
                if attempt == UPDATE_ATTEMPTS:
                    raise
                log.warning("version %d: attempt %d failed (%s); trying again", version, attempt, exc)

    async def _update(self, run: Session, groups: list[TaskGroup]) -> None:
        """One update: request it, wait for the gateways to drain, train, commit, publish."""
        state = run.state
        version = state.version + 1
        started = time.monotonic()
        recipe = self.config.advantage
        chosen = select(groups, state.version, self.config.max_staleness, self.config.zero_variance, recipe)
        scored = ScoredGroups.of(chosen.groups, recipe)  # once: trained on and published alike
        await self._wait_validation(state.version)
        await run.producer.publish(UpdateRequested(run_id=self.config.run_id, version=version,
                                                   n_task_groups=len(chosen.groups)))
        await self._wait_drained(run.producer, version)
        drained = time.monotonic()
        if run.engine is not None:
            try:  # collocated: the replicas give up the accelerators
                await run.engine.before_update(self._committed())
            except EngineError as exc:  # nothing trained yet: the replicas are awake on the committed version
                raise UpdateFailed(f"the engine replicas did not make way for version {version}: {exc}") from exc
        # nothing chosen, nothing learnt: the version still advances, so the record stays one update per batch
        metrics = await asyncio.to_thread(run.backend.update, scored, state.version)
        updated = time.monotonic()
        rewards = [r.reward for g in groups for r in g.rollouts]
        record = UpdateRecord(version=version, metrics=metrics, mean_reward=sum(rewards) / max(len(rewards), 1),
                              dropped_stale=chosen.stale, dropped_no_signal=chosen.no_signal, time=time.time(),
                              advantages=scored.published())
        row = record.row()
        state.version = version
        state.history.append(row)
        for g in groups:
            state.trained[g.group_id] = version
        try:
            final = await self._commit(run, version)
        except EngineError as exc:  # the replicas are back on the committed version: so must the policy be
            await self._revert(run)
            raise UpdateFailed(f"version {version} did not reach the engine: {exc}") from exc
        committed = time.monotonic()
        if run.tracker is not None:
            timing = Timing(generation=started - run.idle_since, drain=drained - started, update=updated - drained,
                            commit=committed - updated)
            run.tracker.log(scalars(record, groups, timing), step=version)
        run.idle_since = committed
        await run.producer.publish(record.event(self.config.run_id))
        await run.producer.publish(WeightVersionPublished(run_id=self.config.run_id, version=version,
                                                          checkpoint_path=str(final), final=self._done(state),
                                                          adapter=self.config.lora is not None))
        log.info("version %d: %d task groups, loss %.4f, mean reward %.3f", version, len(chosen.groups),
                 metrics.loss, record.mean_reward)
        if self.on_update is not None:
            self.on_update(row)

    async def _wait_validation(self, version: int) -> None:
        """While the controller validates the version the engine serves, the next update waits: the round's calls
        are all served by the version it scores. Bounded: a controller that died mid-round does not stop training."""
        if not self.control.validation_pending(version):
            return
        log.info("version %d: waiting for its validation round before the next update", version)
        if not await self._until(lambda: not self.control.validation_pending(version), self.config.validation_wait_s):
            log.warning("version %d: its validation round was not reported within %.0f s; updating anyway (the "
                        "round's later calls will be served by the next version)", version,
                        self.config.validation_wait_s)

    async def _final_validation(self, state: TrainerState) -> None:
        """After the last update of a run that validates, its version's round, so that the loggers have it. A
        controller still running starts it at once; one that is gone (its dataset ran out first) never will, so
        the round must start within FINAL_ROUND_START_S."""
        version = state.version
        if not self.control.validating or not self._done(state):
            return
        log.info("version %d is the last: waiting for its validation round", version)
        if not await self._until(lambda: version in self.control.validating, FINAL_ROUND_START_S):
            log.info("version %d: no validation round started (is the controller done?)", version)
            return
        if not await self._until(lambda: version in self.control.validated, self.config.validation_wait_s):
            log.warning("version %d: its validation round was not reported within %.0f s", version,
                        self.config.validation_wait_s)

    async def _until(self, condition: Callable[[], bool], seconds: float) -> bool:
        """Whether `condition` holds within `seconds`, as the control log is read."""
        deadline = time.monotonic() + seconds
        while not condition() and time.monotonic() < deadline:
            self.control.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.control.changed.wait(), 1.0)
        return condition()

    async def _commit(self, run: Session, version: int) -> Path:
        """Stage the checkpoint, hand it to the engine, then commit it: the update counts from here."""
        staging = await asyncio.to_thread(run.backend.stage, self.config.run_dir, run.state)
        if run.engine is not None:
            await run.engine.deliver(staging, version, self._committed())
        return await asyncio.to_thread(checkpoint.commit, self.config.run_dir, staging, version)

    def _committed(self) -> tuple[Path, int]:
        """The last committed weights and their version, read from the checkpoint itself (the starting model,
        version 0, before any): never the version an update under way has already put in the state."""
        found = checkpoint.latest(self.config.run_dir)
        if found is None:
            return self.config.model, 0
        return found, checkpoint.load_state(found).version

    async def _revert(self, run: Session) -> None:
        """The policy and the state back to the last commit (the update's offsets kept: the retry trains the same
        groups). A backend the loop was given cannot be reopened: the failure is then the run's."""
        if self.backend is not None:
            raise EngineError("the engine refused a version and the given backend cannot be rolled back")
        found = checkpoint.latest(self.config.run_dir)
        await asyncio.to_thread(run.backend.close)
        run.backend = await asyncio.to_thread(open_backend, self.config, self.device, found)
        restored = checkpoint.load_state(found) if found is not None else TrainerState()
        offsets = dict(run.state.offsets)
        for name in ("version", "trained", "history"):
            setattr(run.state, name, getattr(restored, name))
        run.state.offsets = offsets

    async def _wait_drained(self, producer: EventProducer, version: int) -> None:
        """Until every member drained. A member silent past its lease (killed: no GatewayLeft came) is written off
        with a GatewayLeft on its behalf, so the update does not wait out the drain timeout for the dead."""
        deadline = time.monotonic() + self.config.drain_timeout_s
        while True:
            for gateway_id, quiet_s in self.control.silent(self.config.gateway_lease_s).items():
                if gateway_id in self.control.missing(version):
                    log.warning("gateway %s silent for %.0f s: written off for version %d", gateway_id, quiet_s,
                                version)
                    self.control.members.pop(gateway_id, None)
                    await producer.publish(GatewayLeft(
                        run_id=self.config.run_id, gateway_id=gateway_id,
                        reason=f"silent for {quiet_s:.0f} s (no heartbeat) while version {version} waited"))
            missing = self.control.missing(version)
            if not missing:
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                await producer.publish(UpdateAborted(run_id=self.config.run_id, version=version,
                                                     reason=f"gateways {sorted(missing)} did not drain"))
                raise DrainTimeout(f"gateways {sorted(missing)} did not report GatewayDrained for version "
                                   f"{version} within {self.config.drain_timeout_s:.0f} s; update aborted")
            self.control.changed.clear()
            with contextlib.suppress(TimeoutError):  # woken by the log, or to look at the leases again
                await asyncio.wait_for(self.control.changed.wait(), min(remaining, 1.0))
