"""`tether repro`: a recorded run's rollouts run again into a new run, each on the weight version it started on.

Phase by phase (`repro.rerun`): every engine replica is handed the phase's
version (paused, loaded from the checkpoint on the record, its prefix cache
dropped, resumed: as a trainer brings a replica up), the new run records
that it serves the version (`WeightVersionPublished`, with the checkpoint),
and the controller runs the phase's launches with the recorded seeds. Nothing
else may change the engines' weights meanwhile: run it on a stack that is not
training.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from controller.config import RunConfig
from controller.controller import Controller
from controller.main import run
from controller.plan import RunState
from controller.settings import ControllerSettings
from repro.errors import ReproError
from repro.rerun import Phase, choose, phases, published, recorded
from schemas import topics
from schemas.events import WeightVersionPublished
from schemas.producer import EventProducer
from stream_processors.replay import read_run_events
from trainer.engines.base import Replica
from trainer.errors import EngineError

log = logging.getLogger("tether.repro")


async def plan(settings: ControllerSettings, old_run: str, new_run: str, tasks: set[str] | None = None,
               count: int | None = None, validation: bool = False) -> list[Phase]:
    """The phases that run `old_run`'s chosen rollouts again as `new_run`, from the record."""
    events = await read_run_events(settings.bus, old_run, read=(topics.ROLLOUTS, topics.CONTROL))
    chosen = choose(recorded(events, old_run), tasks, count, validation)
    if not chosen:
        raise ReproError(f"no rollouts of run {old_run!r} to run again (tasks: {sorted(tasks) if tasks else 'all'})")
    try:
        return phases(chosen, old_run, new_run, published(events, old_run))
    except ValueError as exc:
        raise ReproError(str(exc)) from exc


async def hand_over(replicas: Sequence[Replica], folder: Path, version: int) -> None:
    for replica in replicas:
        try:
            await replica.pause()
            await replica.load(folder, version)
            await replica.reset_cache()
            await replica.resume()
        except EngineError as exc:
            raise ReproError(f"the engine at {replica.url} refused version {version} ({folder}): {exc}") from exc


async def rerun(config: RunConfig, settings: ControllerSettings, phases_: list[Phase], replicas: Sequence[Replica],
                base: Path | None, on_tick: Callable[[Controller[Any]], None] | None = None) -> RunState:
    """Run the phases in order as `config.run_id` (the run file gives the harness, runner, reward and limits)."""
    if phases_ and phases_[0].version == 0 and base is None:
        raise ReproError("rollouts started on version 0, the base model: name its folder (--base)")
    tasks = {launch.task_id: launch.task for p in phases_ for launch in p.launches}
    config.run_dir.mkdir(parents=True, exist_ok=True)
    dataset = config.run_dir / "repro-tasks.jsonl"  # the tasks as the record has them, for the run's folder
    dataset.write_text("".join(json.dumps(t) + "\n" for t in tasks.values()))
    config = config.model_copy(update={"dataset": dataset, "validation": None})
    state = RunState(config.run_id, config.group_size, config.max_attempts)
    async with EventProducer(settings.bus, client_id=f"repro-{config.run_id}") as producer:
        for phase in phases_:
            folder = base if phase.checkpoint is None else Path(phase.checkpoint)
            assert folder is not None
            log.info("version %d (%s): %d rollouts", phase.version, folder, len(phase.launches))
            await hand_over(replicas, folder, phase.version)
            await producer.publish(WeightVersionPublished(run_id=config.run_id, version=phase.version,
                                                          checkpoint_path=str(folder), adapter=phase.adapter))
            state = await run(config, settings, on_tick, fixed=phase.launches)
    return state
