"""The two steps every path runs, live (Faust agents) and in replay: event → rollout, rollout → task group."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable

from schemas.events import Event, ModelCall, TaskGroup, rollout_of, run_of
from schemas.rollout_ids import within_run
from schemas.serde import decode, encode, to_jsonable
from stream_processors.call_store import CallStore, MemoryCalls
from stream_processors.grouping import GroupState, Policy, build, ready
from stream_processors.join import CompleteRollout, RolloutJoin, call_of


def rollout_step(join: RolloutJoin, calls: CallStore, event: Event, offset: int | None = None
                 ) -> tuple[bool, CompleteRollout | None]:
    """Apply one event (a call goes to `calls`, at `offset` of tether.calls when live): whether the join's state
    changed, and the rollout once it just became complete."""
    if join.done:
        return False, None
    changed = join.apply(event, offset)
    if isinstance(event, ModelCall):
        calls.add(join.rollout_id, call_of(event))
    result = completed(join, calls)
    return changed or result is not None, result


def completed(join: RolloutJoin, calls: CallStore) -> CompleteRollout | None:
    """The rollout if it is complete now; then the join keeps only a marker, and its calls are let go. A
    validation rollout is let go the same way and comes out as nothing: it never reaches tether.samples."""
    held = calls.of(join.rollout_id)
    if not join.complete(held):
        return None
    result = None if join.validation else join.result(held)
    join.close()
    calls.forget(join.rollout_id)
    return result


def group_step(group: GroupState, rollout: CompleteRollout, policy: Policy, raw: bytes | None = None
               ) -> TaskGroup | None:
    """Add one complete rollout (`raw`: its bytes, where the caller read it so); the TaskGroup once the group just
    became ready."""
    if group.emitted:
        return None
    group.add(rollout, raw)
    members = group.members()
    if not ready(members):
        return None
    group.emitted = True
    return build(members, policy)


def rebuild(events: Iterable[Event], run_id: str, policy: Policy) -> list[TaskGroup]:
    """A run's task groups from its events in log order; groups that never became ready come out partial."""
    joins: dict[str, RolloutJoin] = {}
    calls = MemoryCalls()
    groups: dict[str, GroupState] = {}
    out: list[TaskGroup] = []
    for event in events:
        rid = rollout_of(event)
        if rid is None or run_of(event) != run_id:
            continue
        _, rollout = rollout_step(joins.setdefault(rid, RolloutJoin(rid)), calls, event)
        if rollout is not None:
            group = groups.setdefault(rollout.group_id, GroupState(rollout.group_id, time.time()))
            if (ready_group := group_step(group, rollout, policy)) is not None:
                out.append(ready_group)
    for group in groups.values():
        if not group.emitted:
            out.append(build(group.members(), policy, partial=True))
    return sorted(out, key=lambda g: g.group_id)


def canonical(group: TaskGroup) -> str:
    """Through Avro first, so a group rebuilt in memory and one read from tether.samples compare alike."""
    stored = decode(encode(group))
    return json.dumps(to_jsonable(stored), sort_keys=True, separators=(",", ":"))


def content_hash(groups: Iterable[TaskGroup]) -> str:
    """sha256 over the groups' canonical JSON, in group id order: equal hashes, equal training data."""
    digest = hashlib.sha256()
    for group in sorted(groups, key=lambda g: g.group_id):
        digest.update(canonical(group).encode() + b"\n")
    return digest.hexdigest()


def training_hash(groups: Iterable[TaskGroup], run_id: str) -> str:
    """sha256 over what the trainer learns from, comparable across runs: groups and rollouts named within their
    run (`schemas.rollout_ids.within_run`), in that order, without the run's id and the groups' creation times.
    Two runs of the same tasks that gave the same training data hash alike."""
    digest = hashlib.sha256()
    for group in sorted(groups, key=lambda g: within_run(g.group_id, run_id)):
        stored = to_jsonable(decode(encode(group)))
        stored.pop("created_at"), stored.pop("run_id")
        stored["group_id"] = within_run(group.group_id, run_id)
        for rollout in stored["rollouts"] + stored["dropped"]:
            rollout["rollout_id"] = within_run(rollout["rollout_id"], run_id)
        stored["rollouts"].sort(key=lambda r: r["rollout_id"])
        stored["dropped"].sort(key=lambda r: r["rollout_id"])
        digest.update(json.dumps(stored, sort_keys=True, separators=(",", ":")).encode() + b"\n")
    return digest.hexdigest()


def compare(rebuilt: list[TaskGroup], stored: list[TaskGroup]) -> tuple[bool, int]:
    """Whether the rebuild holds exactly the groups tether.samples holds, and how many rebuilt groups it has
    beyond them (groups still incomplete when the topics were read: partial in the rebuild, not yet published)."""
    ids = {g.group_id for g in stored}
    same = [g for g in rebuilt if g.group_id in ids]
    extra = sum(1 for g in rebuilt if g.group_id not in ids and g.partial)
    return len(same) == len(stored) and content_hash(same) == content_hash(stored), extra


def verdict(rebuilt: list[TaskGroup], stored: list[TaskGroup]) -> str:
    """What a replay says of its rebuild against tether.samples: identical, identical for what was published (the
    rest still incomplete), or different."""
    same, pending = compare(rebuilt, stored)
    said = ("identical" if content_hash(stored) == content_hash(rebuilt) else
            f"identical for the {len(stored)} groups published" if same else
            "DIFFERENT: see README (a partial group published while a rollout was still coming)")
    return said + (f"; {pending} more groups are incomplete (partial in the rebuild)" if pending else "")
