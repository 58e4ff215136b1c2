"""`tether diverge`: two runs of the same tasks and seeds compared call by call."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Annotated

import typer
from rich.console import Console

from tether.cli.support import failing_cleanly, load_settings


def diverge(
    run_a: Annotated[str, typer.Argument(help="The first run's id.")],
    run_b: Annotated[str, typer.Argument(help="The second run's id.")],
    as_json: Annotated[bool, typer.Option("--json", help="The comparison as JSON on stdout, for scripts.")] = False,
    show: Annotated[int, typer.Option(help="Divergences shown with their diffs.")] = 5,
) -> None:
    """Pair two runs' rollouts by task and seed and compare them call by call: the share identical, for each pair
    that differs the first call that does and whether the harness or the engine diverged first, what differed
    (a diff, its spans classified: timestamps, random ids, temporary paths, durations, process ids, other)."""
    from repro.diverge import compare, rollouts
    from repro.report import show as show_report
    from schemas.calls import whole
    from schemas.events import ModelCall
    from schemas.settings import BusSettings
    from stream_processors.replay import read_run_events

    bus = load_settings(BusSettings)
    with failing_cleanly():
        runs = {}
        for run in (run_a, run_b):
            events = asyncio.run(read_run_events(bus, run))
            calls = whole(e for e in events if isinstance(e, ModelCall))
            runs[run] = rollouts([*(e for e in events if not isinstance(e, ModelCall)), *calls], run)
    comparison = compare(run_a, runs[run_a], run_b, runs[run_b])
    if as_json:
        json.dump(comparison.to_json(), sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        show_report(comparison, Console(), show)
