"""What `tether repro` runs again: a recorded run's rollouts as the fixed launches of a new run, by weight version.

Each slot of the recorded run (its latest attempt) is one rollout to run
again: the same task (as recorded), seed, temperature and group, named within
the new run as it was within the old (so `tether diverge` pairs them), on the
weight version it started on. Rollouts go in phases, one per version in
ascending order: the engine is handed that version's checkpoint (the run's
`WeightVersionPublished`; version 0 is the base) before any of its rollouts
starts. Pure: events in, phases out.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from dataclasses import dataclass

from controller.plan import Launch
from schemas.events import RolloutStarted, WeightVersionPublished
from schemas.rollout_ids import in_group, place, within_run


@dataclass(frozen=True)
class Phase:
    version: int
    checkpoint: str | None  # None: the base (version 0), which the caller names
    adapter: bool
    launches: list[Launch]


def recorded(events: Iterable[object], run_id: str) -> list[RolloutStarted]:
    """The run's slots, each by its latest attempt, in group and slot order."""
    latest: dict[tuple[str, int, str], RolloutStarted] = {}
    for event in events:
        if not isinstance(event, RolloutStarted) or event.run_id != run_id:
            continue
        found = place(event.rollout_id)  # an id the controller did not write is a slot of its own
        key = (event.group_id, found.slot, "") if found else (event.group_id, 0, event.rollout_id)
        if key not in latest or event.attempt >= latest[key].attempt:
            latest[key] = event
    return [latest[k] for k in sorted(latest)]


def choose(slots: list[RolloutStarted], tasks: set[str] | None = None, count: int | None = None,
           validation: bool = False, sample_seed: int = 0) -> list[RolloutStarted]:
    """Training rollouts (and held-out ones with `validation`), of `tasks` only if given; `count` of them drawn at
    random with `sample_seed` (the same sample every time), in their original order."""
    kept = [s for s in slots if (validation or not s.validation) and (tasks is None or s.task_id in tasks)]
    if count is not None and count < len(kept):
        picked = set(random.Random(sample_seed).sample(range(len(kept)), count))
        kept = [s for i, s in enumerate(kept) if i in picked]
    return kept


def published(events: Iterable[object], run_id: str) -> dict[int, WeightVersionPublished]:
    """The run's weight versions with their checkpoints (the latest publication of each)."""
    return {e.version: e for e in events if isinstance(e, WeightVersionPublished) and e.run_id == run_id}


def phases(chosen: list[RolloutStarted], old_run: str, new_run: str,
           versions: dict[int, WeightVersionPublished]) -> list[Phase]:
    """The launches by weight version, ascending. Raises ValueError for a version whose checkpoint is not on
    the record (it cannot be served again)."""
    by_version: dict[int, list[Launch]] = {}
    for s in chosen:
        found = place(s.rollout_id)
        slot = found.slot if found else 0
        group = f"{new_run}.{within_run(s.group_id, old_run)}"
        by_version.setdefault(s.weight_version, []).append(Launch(
            in_group(group, slot, 0), group, json.loads(s.task_json), slot, 0, None, validation=s.validation,
            temperature=s.temperature, group_size=s.group_size, seed=s.seed))
    out = []
    for version in sorted(by_version):
        if version == 0:
            out.append(Phase(0, None, False, by_version[0]))
            continue
        publication = versions.get(version)
        if publication is None or publication.checkpoint_path is None:
            raise ValueError(f"version {version} of {old_run} has no checkpoint on the record (tether.control): its "
                             f"{len(by_version[version])} rollouts cannot be run on it again")
        out.append(Phase(version, publication.checkpoint_path, publication.adapter, by_version[version]))
    return out
