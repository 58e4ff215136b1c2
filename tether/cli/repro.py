"""`tether diverge` and `tether repro`: two runs of the same tasks and seeds compared call by call, and a recorded
run run again."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from tether.cli.support import config_or_exit, fail, failing_cleanly, load_settings, run_with_bar


def diverge(
    run_a: Annotated[str, typer.Argument(help="The first run's id.")],
    run_b: Annotated[str, typer.Argument(help="The second run's id.")],
    as_json: Annotated[bool, typer.Option("--json", help="The comparison as JSON on stdout, for scripts.")] = False,
    show: Annotated[int, typer.Option(help="Divergences shown with their diffs.")] = 5,
) -> None:
    """Pair two runs' rollouts by task and seed and compare them call by call: the share identical, for each pair
    that differs the first call that does and whether the harness or the engine diverged first, what differed
    (a diff, its spans classified: timestamps, random ids, temporary paths, durations, process ids, other)."""
    from repro.read import compare_runs
    from repro.report import show as show_report
    from stream_processors.grouping import Policy
    from stream_processors.settings import ProcessorSettings

    settings = load_settings(ProcessorSettings)
    with failing_cleanly():
        comparison = asyncio.run(compare_runs(settings.bus, run_a, run_b,
                                              Policy(settings.failed, settings.fill_reward)))
    if as_json:
        json.dump(comparison.to_json(), sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        show_report(comparison, Console(), show)


ENGINE_KINDS = ("tether", "vllm", "sglang")


def repro(
    run: Annotated[str, typer.Argument(help="The recorded run's id.")],
    run_file: Annotated[Path | None, typer.Option(
        "--run-file", help="The run's YAML file: its harness, runner, reward and limits (tasks and seeds come from "
        "the record). Default: the one the controller kept, .tether/runs/RUN/run.yaml.")] = None,
    new_run: Annotated[str | None, typer.Option("--as", help="The new run's id (default: RUN-repro-TIME).")] = None,
    tasks: Annotated[list[str] | None, typer.Option("--tasks", help="Only these task ids (repeatable).")] = None,
    rollouts: Annotated[int | None, typer.Option("--rollouts", min=1, help="A sample of this many rollouts, the "
                                                                         "same one every time.")] = None,
    validation: Annotated[bool, typer.Option(help="Held-out validation rollouts too.")] = False,
    engines: Annotated[list[str] | None, typer.Option("--engine", help="Each engine replica's URL (default: the "
                                                                       "local stack's).")] = None,
    engine_kind: Annotated[str, typer.Option(help="tether, vllm or sglang.")] = "tether",
    base: Annotated[Path | None, typer.Option(help="The base model's folder, for version 0 (default: the local "
                                                   "stack's model).")] = None,
) -> None:
    """Run a recorded run's rollouts again into a new run: the same tasks, seeds and harness, each on the weight
    version it started on (the engines are handed the run's checkpoints in turn). Then `tether diverge RUN NEW`.
    Run it on a stack that is not training: it changes the engines' weights."""
    from controller.config import load_config
    from controller.controller import Controller
    from controller.errors import ControllerError
    from controller.settings import ControllerSettings
    from repro.runner import plan, rerun
    from tether.stack import StackSettings
    from trainer.engines.fleet import open_replica

    if engine_kind not in ENGINE_KINDS:
        fail(f"--engine-kind: {engine_kind!r} is not one of {', '.join(ENGINE_KINDS)}", 2)
    settings = load_settings(ControllerSettings)
    stack = load_settings(StackSettings)
    name = new_run or f"{run}-repro-{time.strftime('%Y%m%d-%H%M%S')}"
    kept = Path(".tether/runs") / run / "run.yaml"
    if run_file is None and not kept.exists():
        fail(f"no --run-file given, and the controller kept none at {kept}", 2)
    config = config_or_exit(load_config, run_file or kept, ControllerError).model_copy(update={"run_id": name})
    replicas = [open_replica(engine_kind, url, 600.0) for url in engines or [stack.engine_url]]

    async def main(update: Callable[..., None]) -> None:
        phases = await plan(settings, run, name, set(tasks) if tasks else None, rollouts, validation)
        total = sum(len(p.launches) for p in phases)
        update(total=total, detail=f"{len(phases)} weight versions: " + ", ".join(
            f"v{p.version} ({len(p.launches)})" for p in phases))
        done_before = 0

        def tick(c: Controller[Any]) -> None:
            finished = sum(1 for s in c.state.rollouts.values() if s.finished is not None)
            update(completed=min(total, done_before + finished), detail=f"version {c.state.version} · running "
                   f"{len(c.state.running())} · finished {finished}")

        await rerun(config, settings, phases, replicas, base or stack.model, tick)

    run_with_bar(f"repro {run} as {name}", None, "reading the record", ControllerError, main)
    typer.echo(f"run {name}: logs in {config.run_dir}; compare: tether diverge {run} {name}", err=True)
