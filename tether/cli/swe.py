"""`tether swe`: coding tasks built from real packages, and their grader."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from tether.cli.support import console, fail

if TYPE_CHECKING:
    from swe.build import Instance

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


def _instance(tasks: Path, task_id: str) -> tuple[Instance, Path]:
    """The task's grading data and the package's clean tree, from a `tether swe build` folder."""
    from swe.build import load_instances

    private = tasks / "private" / "instances.jsonl"
    if not private.exists():
        fail(f"--tasks: {tasks} holds no {private.relative_to(tasks)}: make it with `tether swe build`", 2)
    instance = load_instances(private).get(task_id)
    if instance is None:
        fail(f"--id: no task {task_id!r} in {private}", 2)
    return instance, tasks / "base"


@swe_app.command("checkout")
def swe_checkout(
    task_id: Annotated[str, typer.Option("--id", help="The task's id (tasks.jsonl).")],
    to: Annotated[Path, typer.Option(help="An empty or new folder: the rollout's working copy.")],
    tasks: Annotated[Path, typer.Option(help="A `tether swe build` folder.")] = Path(".tether/swe/tasks"),
) -> None:
    """The task's buggy tree as a repository of one commit, for a rollout to work in."""
    from swe.errors import SweError
    from swe.grade import checkout

    instance, base = _instance(tasks, task_id)
    try:
        checkout(instance, base, to)
    except SweError as exc:
        fail(str(exc))


@swe_app.command("grade")
def swe_grade(
    task_id: Annotated[str, typer.Option("--id", help="The task's id (tasks.jsonl).")],
    workdir: Annotated[Path, typer.Option(help="The rollout's working copy, as the agent left it.")],
    tasks: Annotated[Path, typer.Option(help="A `tether swe build` folder.")] = Path(".tether/swe/tasks"),
    timeout_s: Annotated[float, typer.Option(min=1, help="Time limit of the graded test run.")] = 300.0,
    unhidden_ok: Annotated[bool, typer.Option(help="Grade even where the tasks folder cannot be hidden from the "
                                                   "graded run (no mount namespace): its code could read the "
                                                   "private data and write the clean tree.")] = False,
) -> None:
    """Grade the change in WORKDIR in a fresh copy of the buggy tree; prints one JSON line with `reward` (a
    run's reward command)."""
    import dataclasses
    import json
    import traceback

    from swe.errors import SweError
    from swe.grade import Grade, grade
    from swe.testrun import no_leftovers

    instance, base = _instance(tasks, task_id)
    if not workdir.is_dir():
        fail(f"--workdir: {workdir} is not a folder", 2)
    try:
        with no_leftovers():
            result = grade(instance, base, workdir, timeout_s=timeout_s, unhidden_ok=unhidden_ok)
    except SweError as exc:
        fail(str(exc))
    except Exception as exc:  # whatever the working copy did, the reward line is printed: 0, with the reason
        traceback.print_exc()
        result = Grade(reward=0.0, passed=0.0, failed_tests=[*instance.fail_to_pass, *instance.pass_to_pass],
                       refused=f"the grader failed on this working copy: {exc!r}")
    print(json.dumps(dataclasses.asdict(result)))


@swe_app.command("isolate", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def swe_isolate(
    ctx: typer.Context,
    hide: Annotated[list[Path], typer.Option(help="A folder the command must not see (repeat for more).")],
    alone: Annotated[bool, typer.Option(help="Hide the working folder's siblings too (other rollouts' copies): "
                                             "its parent shows only it.")] = False,
) -> None:
    """Run the command after `--` with the --hide folders empty (a mount namespace of its own): a rollout's agent
    without the tasks' grading data and the package's clean tree."""
    import os
    import sys

    from swe.isolate import hiding

    command = list(ctx.args)
    if not command:
        fail("give the command to run after --", 2)
    missing = [str(p) for p in hide if not p.is_dir()]
    if missing:
        fail(f"--hide: not a folder: {', '.join(missing)}", 2)
    argv = hiding(hide, command, alone=alone)
    if argv is None:
        print("tether swe isolate: no mount namespace can be made here (unshare): the command sees every folder",
              file=sys.stderr)
        argv = command
    os.execvp(argv[0], argv)
