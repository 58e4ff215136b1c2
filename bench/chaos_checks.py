"""The chaos bench's checks: the run read back from the topics after the faults, and held to what must hold.

Figures say how much a fault hurt; these say whether anything was lost or done twice. One function a check,
each from what the harnesses saw, what the topics hold, the trainer's last checkpoint or the monitor, and each
a name, a verdict and a line of detail for the table bench/chaos.py prints.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

from chaos_run import Run

from schemas.events import Event, ModelCall, RolloutFinished, RolloutStarted, TaskGroup, UpdateAborted
from schemas.samples import read_groups
from schemas.settings import BusSettings
from stream_processors.grouping import Policy
from stream_processors.pipeline import compare, content_hash
from stream_processors.replay import replay
from trainer import checkpoint
from trainer.checkpoint import TrainerState


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


def checks(run: Run, calls: list[dict[str, Any]]) -> tuple[list[Check], list[ModelCall]]:
    """Every check, in the table's order; and the ModelCalls recorded on tether.calls (for the plot)."""
    bus = run.broker.client_settings()
    run_id = run.settings.run_id
    events, rebuilt = asyncio.run(replay(bus, run_id, Policy()))
    groups = asyncio.run(_groups(bus, run_id))
    recorded = [e for e in events if isinstance(e, ModelCall)]
    stored = [g for g, again in groups if not again]
    latest = checkpoint.latest(run.settings.run_dir / "checkpoints" / run_id)
    state = checkpoint.load_state(latest) if latest is not None else None
    out = [acknowledged_once(calls, recorded), seqs_gapless(recorded), no_call_failed(run, calls),
           rollouts_finished(run, events), groups_once(groups), replay_is_trained(rebuilt, stored, state),
           trained_once(state), versions_advanced(run)]
    if run.monitor.error is not None:
        out.append(Check("the bench's topic monitor ran throughout", False, repr(run.monitor.error)))
    return out, recorded


async def _groups(bus: BusSettings, run_id: str) -> list[tuple[TaskGroup, bool]]:
    return [pair async for pair in read_groups(bus, run_id)]


def acknowledged_once(calls: list[dict[str, Any]], recorded: list[ModelCall]) -> Check:
    """Every call a harness got a 200 for is on tether.calls exactly once (by the response id)."""
    by_id = Counter(json.loads(c.response_json).get("id") for c in recorded if c.status == "ok")
    acked = [c for c in calls if c["status"] == "ok"]
    missing = [c for c in acked if by_id[c["id"]] == 0]
    twice = [c for c in acked if by_id[c["id"]] > 1]
    unseen = len(set(by_id) - {c["id"] for c in acked})
    return Check("acknowledged calls on tether.calls exactly once", not missing and not twice,
                 f"{len(acked)} calls answered 200 to the harnesses; {len(acked) - len(missing) - len(twice)} "
                 f"found once by response id, {len(missing)} missing, {len(twice)} more than once "
                 f"({len(recorded)} ModelCalls recorded, {unseen} ok ones no harness saw: a retried request "
                 f"or a call cut by the final stop)"
                 + (f"; missing e.g. {missing[:2]}" if missing else ""))


def seqs_gapless(recorded: list[ModelCall]) -> Check:
    per_rollout: dict[str, list[int]] = {}
    for c in recorded:
        per_rollout.setdefault(c.rollout_id, []).append(c.seq)
    bad_seqs = {r: sorted(s) for r, s in per_rollout.items() if sorted(s) != list(range(len(s)))}
    return Check("each rollout's seqs unique and gapless", not bad_seqs,
                 f"{len(per_rollout)} rollouts with calls" + (f"; bad: {dict(list(bad_seqs.items())[:3])}"
                                                              if bad_seqs else ""))


def no_call_failed(run: Run, calls: list[dict[str, Any]]) -> Check:
    failed_calls = [c for c in calls if c["status"] != "ok"]
    return Check("no call failed as the harness saw it", not failed_calls,
                 f"{len(failed_calls)} of {len(calls)}" + (
                     f": {Counter(c['status'] for c in failed_calls).most_common()}; first "
                     f"{failed_calls[0]['rollout']} at +{failed_calls[0]['end'] - run.started:.1f} s: "
                     f"{failed_calls[0].get('error')}" if failed_calls else ""))


def rollouts_finished(run: Run, events: list[Event]) -> Check:
    """Every rollout ends with a result, none failed because of the infrastructure (the bench's final stop
    cancels those still running)."""
    started = {e.rollout_id for e in events if isinstance(e, RolloutStarted)}
    finished: dict[str, list[RolloutFinished]] = {}
    for e in events:
        if isinstance(e, RolloutFinished):
            finished.setdefault(e.rollout_id, []).append(e)
    unfinished = started - set(finished)
    statuses = Counter(fs[-1].status for fs in finished.values())
    by_bench = {r for r, fs in finished.items()
                if fs[-1].status == "cancelled" and fs[-1].finished_at.timestamp() >= run.stopped}
    bad = {r: fs[-1] for r, fs in finished.items() if fs[-1].status != "succeeded" and r not in by_bench}
    repeated = {r: [f.status for f in fs] for r, fs in finished.items() if len(fs) > 1}
    return Check("every rollout finished; none failed", not unfinished and not bad,
                 f"{len(started)} started; statuses {dict(statuses)} ({len(by_bench)} cancelled by the bench's "
                 f"final stop); {len(unfinished)} without a result"
                 + (f"; failed: {[(r, f.status, f.reason) for r, f in list(bad.items())[:4]]}" if bad else "")
                 + (f"; finished more than once: {dict(list(repeated.items())[:3])}" if repeated else ""))


def groups_once(groups: list[tuple[TaskGroup, bool]]) -> Check:
    repeats = [g.group_id for g, again in groups if again]
    stored = [g for g, again in groups if not again]
    return Check("task groups exactly once on tether.samples", not repeats,
                 f"{len(stored)} groups, {len(repeats)} repeated" + (f": {repeats[:4]}" if repeats else ""))


def replay_is_trained(rebuilt: list[TaskGroup], stored: list[TaskGroup], state: TrainerState | None) -> Check:
    """The replay equals tether.samples, and the groups the trainer trained hash the same in both."""
    trained = set(state.trained) if state is not None else set()
    same, pending = compare(rebuilt, stored)
    stored_trained = [g for g in stored if g.group_id in trained]
    rebuilt_trained = [g for g in rebuilt if g.group_id in trained]
    hashes_equal = content_hash(stored_trained) == content_hash(rebuilt_trained)
    return Check("replay hash equals what was trained",
                 same and hashes_equal and trained <= {g.group_id for g in stored},
                 f"replay vs tether.samples: {'identical' if same else 'DIFFERENT'} over {len(stored)} groups "
                 f"(+{pending} still partial in the replay); the {len(trained)} trained groups: sha256 "
                 f"{content_hash(stored_trained)[:16]}... on tether.samples, "
                 f"{content_hash(rebuilt_trained)[:16]}... rebuilt")


def trained_once(state: TrainerState | None) -> Check:
    trained = set(state.trained) if state is not None else set()
    n_history = int(sum(h["task_groups"] for h in state.history)) if state is not None else 0
    return Check("no group trained twice", n_history == len(trained),
                 f"{n_history} groups over {len(state.history) if state else 0} updates, {len(trained)} distinct")


def versions_advanced(run: Run) -> Check:
    """Weight versions kept advancing across every fault (a newer one within `--settle` s of the part back)."""
    monitor = run.monitor
    versions = monitor.versions()
    stalled = [f.what for f in run.faults if monitor.version_at(max(f.back, f.killed + 1) + run.args.settle)
               <= monitor.version_at(f.killed)]
    aborted = sum(isinstance(e, UpdateAborted) for _, e in monitor.seen)
    return Check("weight versions advanced across every fault", not stalled and bool(versions),
                 f"v{versions[0][1] if versions else '-'} → v{versions[-1][1] if versions else '-'} "
                 f"({len(versions)} published, {aborted} updates aborted; the bench's monitor read a version "
                 f"at most {run.monitor.lag():.1f} s after it was published)"
                 + (f"; no new version after: {stalled}" if stalled else ""))
