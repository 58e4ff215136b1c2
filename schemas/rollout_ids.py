"""How a run names its task groups and rollouts, and how a rollout id is read back.

`RUN.TASK` names a training group, `RUN.ROUND-SETTING.TASK` a validation
group, and `GROUP.rSLOT.aATTEMPT` a rollout: its slot in the group and its
attempt at that slot. The controller writes these ids; tools that compare
runs read the slot back and drop the run's name.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

_TAIL = re.compile(r"\.r(\d+)\.a(\d+)$")


def task_key(task_id: str) -> str:
    """A task id as a piece of a rollout id (which appears in URL paths): safe characters, still unique."""
    safe = re.sub(r"[^A-Za-z0-9_-]", "_", task_id)[:48]
    if safe == task_id:
        return safe
    return f"{safe}-{hashlib.sha256(task_id.encode()).hexdigest()[:8]}"


def group_id(run_id: str, task_id: str, validation: str | None = None) -> str:
    """`validation`: the round and setting (`controller.validation.group_key`) of a validation group."""
    return f"{run_id}.{task_key(task_id)}" if validation is None else f"{run_id}.{validation}.{task_key(task_id)}"


def rollout_id(run_id: str, task_id: str, slot: int, attempt: int, validation: str | None = None) -> str:
    return in_group(group_id(run_id, task_id, validation), slot, attempt)


def in_group(group: str, slot: int, attempt: int) -> str:
    """The id of the rollout at `slot` and `attempt` of the group named `group`."""
    return f"{group}.r{slot}.a{attempt}"


@dataclass(frozen=True, slots=True)
class Place:
    slot: int
    attempt: int


def place(rid: str) -> Place | None:
    """A rollout id's slot and attempt; None for an id the controller did not write (a harness's own)."""
    found = _TAIL.search(rid)
    return Place(int(found.group(1)), int(found.group(2))) if found else None


def with_place(rid: str, slot: int, attempt: int) -> str:
    """A rollout id of the same group, for another slot and attempt."""
    return _TAIL.sub(in_group("", slot, attempt), rid)


def within_run(name: str, run_id: str) -> str:
    """A group or rollout id without its run's name: what two runs of the same tasks have in common."""
    return name[len(run_id) + 1:] if name.startswith(run_id + ".") else name
