"""`tether swe`: coding tasks built from real packages, and their grader."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tether.cli_support import console, fail

swe_app = typer.Typer(help="Coding tasks from real packages: build them, grade a rollout's change.",
                      no_args_is_help=True)


@swe_app.command("build")
def swe_build(
    package: Annotated[str, typer.Option(help="A pure-Python package whose sdist ships its tests, NAME==VERSION.")],
    out: Annotated[Path, typer.Option(help="Where the tasks go (replaced).")] = Path(".tether/swe/tasks"),
    cache: Annotated[Path, typer.Option(help="Downloaded source distributions.")] = Path(".tether/swe/sdists"),
    max_candidates: Annotated[int, typer.Option(min=1, help="Bugs to try (a test run or two each).")] = 200,
    max_failing: Annotated[int, typer.Option(min=1, help="Drop a bug that breaks more tests than this.")] = 20,
    seed: Annotated[int, typer.Option(help="Which candidates are tried.")] = 0,
    timeout_s: Annotated[float, typer.Option(min=1, help="Time limit of one run of the tests.")] = 300.0,
) -> None:
    """Inject bugs into the package's functions, keep those its tests catch, write tasks.jsonl."""
    from swe.build import build
    from swe.errors import SweError

    try:
        kept = build(package, out, cache=cache, max_candidates=max_candidates, max_failing=max_failing, seed=seed,
                     timeout_s=timeout_s, say=lambda line: console.print(line, highlight=False))
    except SweError as exc:
        fail(str(exc))
    console.print(f"{len(kept)} tasks: {out / 'tasks.jsonl'} (grading data: {out / 'private'}; figures: "
                  f"{out / 'build.json'})", highlight=False)
