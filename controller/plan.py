"""What has happened in a run and what to launch next: a fold over tether.rollouts, no I/O.

A task group has K slots. A slot's first rollout is attempt 0; a rollout that
ends `lost` (it could not start, or vanished while no controller watched it)
or `cancelled` (the controller was stopped) is followed by a new attempt with
`retry_of` pointing at it, until `max_attempts`. A slot is done when one of
its rollouts ends succeeded, failed or timeout (task failures are not
retried). The run is done when every slot of every task is done (or out of
attempts), or when the trainer has published its final version: nothing
launched after that can be trained on. Rollout ids are deterministic, so a
restarted controller that rebuilt this state plans exactly the launches that
are still missing.

Validation rollouts (`controller.validation`) live in groups of their own,
one per round, setting and held-out task, with the same slots and retries;
they count neither towards the training groups in flight nor towards the
dataset being done.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from controller.validation import Outcome, Round, Setting, due, group_key, score
from schemas.events import (
    Event,
    RewardReported,
    RolloutFinished,
    RolloutStarted,
    UpdateAborted,
    UpdateRequested,
    ValidationReported,
    ValidationScore,
    ValidationStarted,
    WeightVersionPublished,
    run_of,
)
from schemas.rollout_ids import group_id, place, rollout_id, with_place

DONE = frozenset({"succeeded", "failed", "timeout"})  # the slot has its rollout
RETRY = frozenset({"lost", "cancelled"})  # the slot needs another attempt


@dataclass
class RolloutState:
    started: RolloutStarted
    slot: int
    finished: RolloutFinished | None = None
    reward: RewardReported | None = None


@dataclass(frozen=True)
class Launch:
    """One rollout to start."""
    rollout_id: str
    group_id: str
    task: dict[str, Any]
    slot: int
    attempt: int
    retry_of: str | None
    #: a validation rollout: the temperature its token pins (None: the harness's own) and its group's size
    validation: bool = False
    temperature: float | None = None
    group_size: int | None = None
    #: its seed where it is already fixed (a recorded rollout's, restarted or reproduced); else drawn from the run's
    seed: int | None = None

    @property
    def task_id(self) -> str:
        return str(self.task["id"])


@dataclass
class RunState:
    run_id: str
    group_size: int
    max_attempts: int
    rollouts: dict[str, RolloutState] = field(default_factory=dict)
    #: group id → slot → rollout ids in attempt order (training groups)
    slots: dict[str, dict[int, list[str]]] = field(default_factory=dict)
    #: the same for validation groups
    validation_slots: dict[str, dict[int, list[str]]] = field(default_factory=dict)
    version: int = 0  # the latest weight version the trainer published for the run
    final: int | None = None  # the version the trainer said was its last
    requested: int = 0  # the latest version the trainer asked the gateways to drain for
    settled: int = 0  # the latest version published or aborted
    rounds: dict[int, Round] = field(default_factory=dict)  # validation rounds by the version they validate

    def apply(self, event: Event) -> None:
        if run_of(event) != self.run_id:
            return
        if isinstance(event, WeightVersionPublished):
            self.version = max(self.version, event.version)
            self.settled = max(self.settled, event.version)
            if event.final:
                self.final = event.version
        elif isinstance(event, UpdateRequested):
            self.requested = max(self.requested, event.version)
        elif isinstance(event, UpdateAborted):
            self.settled = max(self.settled, event.version)
        elif isinstance(event, ValidationStarted):
            found = self.rounds.setdefault(event.version, Round(event.version))
            found.started = found.started or event
        elif isinstance(event, ValidationReported):
            found = self.rounds.setdefault(event.version, Round(event.version))
            found.reported = found.reported or event
        elif isinstance(event, RolloutStarted):
            if event.rollout_id in self.rollouts:
                return  # a duplicate delivery
            slot = self._slot_of(event)
            self.rollouts[event.rollout_id] = RolloutState(event, slot)
            groups = self.validation_slots if event.validation else self.slots
            ids = groups.setdefault(event.group_id, {}).setdefault(slot, [])
            ids.append(event.rollout_id)
            ids.sort(key=lambda r: self.rollouts[r].started.attempt)
        elif isinstance(event, RolloutFinished):
            state = self.rollouts.get(event.rollout_id)
            if state is not None and state.finished is None:
                state.finished = event
        elif isinstance(event, RewardReported) and event.call_id is None:  # a step reward is not the rollout's
            state = self.rollouts.get(event.rollout_id)
            if state is not None and state.reward is None:
                state.reward = event

    def _slot_of(self, event: RolloutStarted) -> int:
        # From the id, not from arrival order: a group's rollouts are spread over partitions.
        parsed = place(event.rollout_id)
        if parsed is not None:
            return parsed.slot
        if event.retry_of is not None and event.retry_of in self.rollouts:
            return self.rollouts[event.retry_of].slot
        return len((self.validation_slots if event.validation else self.slots).get(event.group_id, {}))

    def running(self) -> list[RolloutState]:
        """Started and not finished: running, or lost while no controller watched."""
        return [s for s in self.rollouts.values() if s.finished is None]

    def _slot_done(self, ids: list[str]) -> bool:
        last = self.rollouts[ids[-1]]
        if last.finished is None:
            return False
        return last.finished.status in DONE or len(ids) >= self.max_attempts

    def group_done(self, gid: str) -> bool:
        slots = self.slots.get(gid, {})
        return len(slots) == self.group_size and all(self._slot_done(ids) for ids in slots.values())

    def _next_in_group(self, slots: dict[int, list[str]], size: int, new: Launch) -> Launch | None:
        """The group's next rollout: a retry of a slot whose rollout was lost or cancelled, else a new slot;
        `new` is the launch of slot 0, attempt 0, the others are derived from it."""
        for slot, ids in sorted(slots.items()):
            last = self.rollouts[ids[-1]]
            if last.finished is not None and last.finished.status in RETRY and len(ids) < self.max_attempts:
                attempt = last.started.attempt + 1
                return replace(new, rollout_id=with_place(new.rollout_id, slot, attempt), slot=slot,
                               attempt=attempt, retry_of=last.started.rollout_id)
        if len(slots) < size:
            slot = len(slots)
            return replace(new, rollout_id=with_place(new.rollout_id, slot, 0), slot=slot)
        return None

    def groups_in_flight(self) -> int:
        return sum(1 for gid in self.slots if not self.group_done(gid))

    def finished_rollouts(self, gid: str) -> list[RolloutState]:
        """The group's rollouts that count: one per done slot."""
        out = []
        for ids in self.slots.get(gid, {}).values():
            last = self.rollouts[ids[-1]]
            if last.finished is not None and last.finished.status in DONE:
                out.append(last)
        return out

    def _window_open(self, tasks: list[dict[str, Any]], index: int, sync_batch: int) -> bool:
        """Synchronous mode: the group at `index` (dataset order) is in window index // B, which opens once the
        earlier windows are done and the trainer has published one version per earlier window."""
        window = index // sync_batch
        started = [s.started.weight_version for s in self.rollouts.values()]
        base = min(started) if started else self.version
        earlier = tasks[:window * sync_batch]
        return self.version >= base + window and all(
            self.group_done(group_id(self.run_id, str(t["id"]))) for t in earlier)

    def next_launch(self, tasks: list[dict[str, Any]], max_groups_in_flight: int,
                    sync_batch: int | None = None) -> Launch | None:
        """The next rollout to start, tasks in dataset order; None when nothing may start now."""
        in_flight = self.groups_in_flight()
        for index, task in enumerate(tasks):
            tid = str(task["id"])
            gid = group_id(self.run_id, tid)
            slots = self.slots.get(gid)
            if slots is None:
                if in_flight >= max_groups_in_flight:
                    return None  # groups are handed out in order: wait for one to finish
                if sync_batch is not None and not self._window_open(tasks, index, sync_batch):
                    return None  # synchronous: wait for the batch to finish and the trainer to update
                return Launch(rollout_id(self.run_id, tid, 0, 0), gid, task, 0, 0, None)
            launch = self._next_in_group(slots, self.group_size,
                                         Launch(rollout_id(self.run_id, tid, 0, 0), gid, task, 0, 0, None))
            if launch is not None:
                return launch
        return None

    def done(self, tasks: list[dict[str, Any]]) -> bool:
        """Every task group has its rollouts, or the trainer has made its last update."""
        return self.final is not None or all(self.group_done(group_id(self.run_id, str(t["id"]))) for t in tasks)

    # -- validation ----------------------------------------------------------------

    def round_due(self, every: int) -> bool:
        """The version the engine serves is due for validation and has no round yet. While an update past it is
        pending (requested, neither published nor aborted), it is let go: its rollouts would be served by the next
        version."""
        v = self.version
        pending = self.requested > v and self.requested > self.settled
        return v not in self.rounds and not pending and due(v, every, self.final == v)

    def open_round(self) -> Round | None:
        """The round started and not yet reported (at most one: the trainer waits for each)."""
        return next((r for _, r in sorted(self.rounds.items()) if r.open), None)

    def _validation_groups(self, version: int, tasks: list[dict[str, Any]], settings: list[Setting]
                           ) -> list[tuple[Setting, dict[str, Any], str]]:
        return [(s, t, group_id(self.run_id, str(t["id"]), group_key(version, s))) for s in settings for t in tasks]

    def next_validation_launch(self, version: int, tasks: list[dict[str, Any]], settings: list[Setting],
                               samples: int) -> Launch | None:
        """The round's next rollout, settings then tasks in order; None when all are out."""
        for setting, task, gid in self._validation_groups(version, tasks, settings):
            key = group_key(version, setting)
            first = Launch(rollout_id(self.run_id, str(task["id"]), 0, 0, key), gid, task, 0, 0, None,
                           validation=True, temperature=setting.temperature, group_size=samples)
            launch = self._next_in_group(self.validation_slots.get(gid, {}), samples, first)
            if launch is not None:
                return launch
        return None

    def round_scores(self, version: int, tasks: list[dict[str, Any]], settings: list[Setting], samples: int
                     ) -> list[ValidationScore] | None:
        """Each setting's score once every validation group of the round is done; None while any runs."""
        outcomes: dict[Setting, list[Outcome]] = {s: [] for s in settings}
        for setting, _, gid in self._validation_groups(version, tasks, settings):
            slots = self.validation_slots.get(gid, {})
            if len(slots) < samples or not all(self._slot_done(ids) for ids in slots.values()):
                return None
            for ids in slots.values():
                finished = self.rollouts[ids[-1]].finished
                assert finished is not None  # the slot is done
                if finished.status in DONE:  # a slot out of attempts scores nothing: it is not the policy's doing
                    outcomes[setting].append(Outcome(finished.status, finished.reward, finished.duration_s))
        return [score(s, outcomes[s]) for s in settings]


