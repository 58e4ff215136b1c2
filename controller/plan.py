"""What has happened in a run and what to launch next: a fold over tether.rollouts, no I/O.

A task group has K slots. A slot's first rollout is attempt 0; a rollout that
ends `lost` (it could not start, or vanished while no controller watched it)
or `cancelled` (the controller was stopped) is followed by a new attempt with
`retry_of` pointing at it, until `max_attempts`. A slot is done when one of
its rollouts ends succeeded, failed or timeout (task failures are not
retried). The run is done when every slot of every task is done (or out of
attempts). Rollout ids are deterministic, so a restarted controller that
rebuilt this state plans exactly the launches that are still missing.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

from schemas.events import Event, RewardReported, RolloutFinished, RolloutStarted, WeightVersionPublished, run_of

_ID_TAIL = re.compile(r"\.r(\d+)\.a\d+$")
DONE = frozenset({"succeeded", "failed", "timeout"})  # the slot has its rollout
RETRY = frozenset({"lost", "cancelled"})  # the slot needs another attempt


def task_key(task_id: str) -> str:
    """A task id as a piece of a rollout id (which appears in URL paths): safe characters, still unique."""
    safe = re.sub(r"[^A-Za-z0-9_-]", "_", task_id)[:48]
    if safe == task_id:
        return safe
    return f"{safe}-{hashlib.sha256(task_id.encode()).hexdigest()[:8]}"


def group_id(run_id: str, task_id: str) -> str:
    return f"{run_id}.{task_key(task_id)}"


def rollout_id(run_id: str, task_id: str, slot: int, attempt: int) -> str:
    return f"{group_id(run_id, task_id)}.r{slot}.a{attempt}"


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

    @property
    def task_id(self) -> str:
        return str(self.task["id"])


@dataclass
class RunState:
    run_id: str
    group_size: int
    max_attempts: int
    rollouts: dict[str, RolloutState] = field(default_factory=dict)
    #: group id → slot → rollout ids in attempt order
    slots: dict[str, dict[int, list[str]]] = field(default_factory=dict)
    version: int = 0  # the latest weight version the trainer published for the run

    def apply(self, event: Event) -> None:
        if run_of(event) != self.run_id:
            return
        if isinstance(event, WeightVersionPublished):
            self.version = max(self.version, event.version)
        elif isinstance(event, RolloutStarted):
            if event.rollout_id in self.rollouts:
                return  # a duplicate delivery
            slot = self._slot_of(event)
            self.rollouts[event.rollout_id] = RolloutState(event, slot)
            ids = self.slots.setdefault(event.group_id, {}).setdefault(slot, [])
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
        parsed = _ID_TAIL.search(event.rollout_id)
        if parsed is not None:
            return int(parsed.group(1))
        if event.retry_of is not None and event.retry_of in self.rollouts:
            return self.rollouts[event.retry_of].slot
        return len(self.slots.get(event.group_id, {}))

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
            for slot, ids in sorted(slots.items()):
                last = self.rollouts[ids[-1]]
                if (last.finished is not None and last.finished.status in RETRY
                        and len(ids) < self.max_attempts):
                    attempt = last.started.attempt + 1
                    return Launch(rollout_id(self.run_id, tid, slot, attempt), gid, task, slot, attempt,
                                  last.started.rollout_id)
            if len(slots) < self.group_size:
                slot = len(slots)
                return Launch(rollout_id(self.run_id, tid, slot, 0), gid, task, slot, 0, None)
        return None

    def done(self, tasks: list[dict[str, Any]]) -> bool:
        return all(self.group_done(group_id(self.run_id, str(t["id"]))) for t in tasks)
