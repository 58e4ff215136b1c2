"""`tether controller | rollouts | processors | replay | analytics | trainer`: the services of a training run."""

from __future__ import annotations

import asyncio
import functools
import logging
import shutil
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from tether.cli_support import console, fail, failing_cleanly, load_settings, progress_bar

if TYPE_CHECKING:
    from controller.plan import RunView
    from trainer.checkpoint import TrainerState

controller_app = typer.Typer(help="The rollout controller: runs K harness rollouts per task.", no_args_is_help=True)
rollouts_app = typer.Typer(help="Rollouts of a run, as tether.rollouts records them.", no_args_is_help=True)
processors_app = typer.Typer(help="Stream processors: calls joined to rollouts, task groups, analytics sink.",
                             no_args_is_help=True)
trainer_app = typer.Typer(help="The trainer: task groups in, weight versions out.", no_args_is_help=True)


C = TypeVar("C")
T = TypeVar("T")


def _config_or_exit(load: Callable[[Path], C], path: Path, error: type[Exception]) -> C:
    """A service's YAML file; an invalid one exits 2 with the error (it names the file and the field)."""
    try:
        return load(path)
    except error as exc:
        fail(str(exc), 2)


def _run_with_bar(title: str, total: int | None, detail: str, error: type[Exception],
                  main: Callable[[Callable[..., None]], Coroutine[Any, Any, T]]) -> T:
    """Run a service to its end under a progress bar; `main` gets the bar's update. Its own errors (`error`) and
    the bus's become one line on stderr and exit code 1."""
    progress = progress_bar()
    bar = progress.add_task(title, total=total, detail=detail)
    with failing_cleanly(), progress:
        try:
            return asyncio.run(main(functools.partial(progress.update, bar)))
        except error as exc:
            fail(str(exc))


@controller_app.command("run")
def controller_run(
    config: Annotated[Path, typer.Argument(help="The run's YAML file (dataset, group size, harness, runner...).")],
) -> None:
    """Launch K rollouts per task until every task group is done; Ctrl-C cancels what runs (resumable)."""
    from controller.config import load_config
    from controller.controller import Controller
    from controller.errors import ControllerError
    from controller.main import run
    from controller.settings import ControllerSettings

    settings = load_settings(ControllerSettings)
    cfg = _config_or_exit(load_config, config, ControllerError)

    def main(update: Callable[..., None]) -> Coroutine[Any, Any, RunView]:
        def tick(c: Controller[Any]) -> None:
            finished = [s for s in c.view.rollouts.values() if s.finished is not None]
            counted = [s for s in finished if s.finished and s.finished.status in ("succeeded", "failed", "timeout")]
            rewards = [s.finished.reward for s in counted if s.finished and s.finished.reward is not None]
            mean = f"mean reward {sum(rewards) / len(rewards):.3f}" if rewards else "no rewards yet"
            update(total=len(c.tasks) * cfg.group_size, completed=len(counted),
                   detail=f"running {len(c.view.running())} · finished {len(finished)} · {mean}")

        return run(cfg, settings, tick)

    view = _run_with_bar(f"run {cfg.run_id}", None, "", ControllerError, main)
    done = sum(1 for t in view.slots if view.group_done(t))
    typer.echo(f"run {cfg.run_id}: {done} task groups done; logs in {cfg.run_dir}", err=True)


@rollouts_app.command("ls")
def rollouts_ls(run: Annotated[str, typer.Option("--run", help="The run id.")]) -> None:
    """Every rollout of a run: task, attempt, status, reward, duration."""
    from controller.history import read_run
    from schemas.settings import BusSettings

    settings = load_settings(BusSettings)
    with failing_cleanly():
        view = asyncio.run(read_run(settings, run))
    Console().print(rollouts_table(view, run))


def rollouts_table(view: RunView, run: str) -> Table:
    """Ids are kept whole however narrow the terminal (people copy them); the reason wraps instead."""
    table = Table(title=f"rollouts of run {run}")
    longest = {c: max((len(x) for x in xs), default=0) for c, xs in (
        ("rollout", view.rollouts), ("task", [s.started.task_id for s in view.rollouts.values()]))}
    for column in ("rollout", "task"):
        table.add_column(column, no_wrap=True, min_width=longest[column])
    for column in ("attempt", "status", "exit", "reward", "seconds"):
        table.add_column(column, no_wrap=True)
    table.add_column("reason", overflow="fold")
    for rid, state in sorted(view.rollouts.items()):
        f = state.finished
        table.add_row(rid, state.started.task_id, str(state.started.attempt), f.status if f else "running",
                      "" if f is None or f.exit_code is None else str(f.exit_code),
                      "" if f is None or f.reward is None else f"{f.reward:g}",
                      "" if f is None else f"{f.duration_s:.1f}", (f.reason or "") if f else "")
    return table


@processors_app.command("run")
def processors_run(
    run_id: Annotated[str | None, typer.Option("--run", help="Only this run's events.")] = None,
) -> None:
    """Join, group and sink until interrupted (settings: TETHER_PROCESSOR_*, Kafka: TETHER_BUS_*)."""
    from faust.worker import Worker

    from schemas.admin import ensure_topics
    from stream_processors.app import create_app, internal_topics
    from stream_processors.settings import ProcessorSettings

    settings = load_settings(ProcessorSettings, run_id=run_id)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    with failing_cleanly():
        asyncio.run(ensure_topics(settings.bus, internal_topics(settings)))
    worker = Worker(create_app(settings), loglevel="info", quiet=True)
    # Faust's progress spinner puts the root logger at DEBUG so that it spins on every record: every library's
    # debug message was built and dropped (aiokafka writes several per request). The processors' own info shows.
    worker.spinner = None
    for name in ("faust", "mode", "aiokafka", "clickhouse_connect", "stream_processors.recovery"):
        logging.getLogger(name).setLevel(logging.WARNING)
    worker.execute_from_commandline()


def replay_run(
    run: Annotated[str, typer.Option("--run", help="The run id.")],
    out: Annotated[Path | None, typer.Option(help="Write the task groups here, one JSON object per line.")] = None,
    compare: Annotated[bool, typer.Option(help="Also hash what tether.samples holds for the run.")] = True,
) -> None:
    """Rebuild a run's task groups from tether.calls and tether.rollouts, with a content hash."""
    from rich.progress import Progress

    from schemas.samples import unique_groups
    from stream_processors.grouping import Policy
    from stream_processors.pipeline import compare as compare_groups
    from stream_processors.pipeline import content_hash
    from stream_processors.replay import replay, write_jsonl
    from stream_processors.settings import ProcessorSettings

    settings = load_settings(ProcessorSettings)
    with failing_cleanly(), Progress(console=console) as progress:
        events, groups = asyncio.run(replay(settings.bus, run, Policy(settings.failed, settings.fill_reward),
                                            progress))
        stored = asyncio.run(unique_groups(settings.bus, run)) if compare else None
    rebuilt = content_hash(groups)
    partial = sum(g.partial for g in groups)
    typer.echo(f"replayed {len(events)} events of run {run}: {len(groups)} task groups ({partial} partial)")
    typer.echo(f"rebuilt   sha256 {rebuilt}")
    if out is not None:
        write_jsonl(groups, out)
        typer.echo(f"wrote {out}")
    if stored is not None:
        same, pending = compare_groups(groups, stored)
        typer.echo(f"samples   sha256 {content_hash(stored)} ({len(stored)} task groups on tether.samples)")
        typer.echo(("identical" if content_hash(stored) == rebuilt else
                    f"identical for the {len(stored)} groups published" if same else
                    "DIFFERENT: see README (a partial group published while a rollout was still coming)")
                   + (f"; {pending} more groups are incomplete (partial in the rebuild)" if pending else ""))


def analytics(
    run: Annotated[str, typer.Option("--run", help="The run id.")],
    dsn: Annotated[str | None, typer.Option(help="ClickHouse DSN (default: TETHER_PROCESSOR_CLICKHOUSE_DSN if set, "
                                                 "else the sink of `tether up`'s run folder if there is one).")]
    = None,
    out: Annotated[Path, typer.Option(help="Where to write the plot.")] = Path(".tether/analytics"),
) -> None:
    """Reward per weight version, tokens and calls per rollout, gateway latency, staleness, failures."""
    from analytics.report import plot, print_results, run_queries
    from analytics.sink import connect
    from stream_processors.errors import ProcessorError
    from stream_processors.settings import ProcessorSettings
    from tether.stack import StackSettings

    settings = load_settings(ProcessorSettings)
    stack_sink = load_settings(StackSettings).home / "runs" / run / "clickhouse"  # where `tether up` puts it
    if dsn is None and "clickhouse_dsn" not in settings.model_fields_set and stack_sink.is_dir():
        dsn = f"chdb://{stack_sink}"
    target = dsn or settings.clickhouse_dsn
    if not target:
        fail("no ClickHouse DSN: pass --dsn or set TETHER_PROCESSOR_CLICKHOUSE_DSN", 2)
    try:
        results = run_queries(connect(target), run)
    except ProcessorError as exc:
        fail(str(exc))
    print_results(results, run, Console(width=max(130, shutil.get_terminal_size().columns)))
    typer.echo(f"plot: {plot(results, run, out / f'{run}.png')}", err=True)


@trainer_app.command("run")
def trainer_run(
    config: Annotated[Path, typer.Argument(help="The trainer's YAML file (run_id, model, batch_groups, lr...).")],
) -> None:
    """Train on the run's task groups as they arrive; pause, update and resume the gateways each B groups."""
    from schemas.settings import BusSettings
    from trainer.config import load_config as load_trainer_config
    from trainer.errors import TrainerError
    from trainer.loop import Trainer
    from trainer.report import plot_history

    bus = load_settings(BusSettings)
    cfg = _config_or_exit(load_trainer_config, config, TrainerError)

    def main(update: Callable[..., None]) -> Coroutine[Any, Any, TrainerState]:
        def tick(m: dict[str, float]) -> None:
            update(advance=1, detail=f"v{m['version']:.0f} reward {m['mean_reward']:.3f} "
                                     f"loss {m['loss']:.4f} ({m['task_groups']:.0f} groups)")

        return Trainer(cfg, bus, on_update=tick).run()

    state = _run_with_bar(f"updates of {cfg.run_id}", cfg.max_updates, "waiting for task groups", TrainerError, main)
    if state.history:
        out = plot_history(state.history, cfg.run_dir / "updates.png", f"run {cfg.run_id}")
        typer.echo(f"{len(state.history)} updates, now version {state.version}; plot: {out}", err=True)


@trainer_app.command("verl-config")
def trainer_verl_config(
    config: Annotated[Path, typer.Argument(help="The trainer's YAML file.")],
    gpu: Annotated[bool, typer.Option(help="As on GPUs (bfloat16, flash attention); default: as this machine.")]
    = False,
) -> None:
    """The `actor_rollout_ref` config verl's workers get with `backend: verl`: verl's own defaults, this run's
    settings merged in (YAML on stdout)."""
    import torch
    from omegaconf import OmegaConf

    from trainer.config import load_config as load_trainer_config
    from trainer.errors import TrainerError
    from trainer.verl.workers import actor_config

    cfg = _config_or_exit(load_trainer_config, config, TrainerError)
    cpu = not (gpu or torch.cuda.is_available())
    typer.echo(OmegaConf.to_yaml(actor_config(cfg, cfg.workers, cpu=cpu), resolve=False))


def view(
    run: Annotated[str | None, typer.Option("--run", help="Only this run (default: every run on the topics).")]
    = None,
    dsn: Annotated[str | None, typer.Option(help="The page's store (default TETHER_VIEW_DSN, else "
                                                 "chdb://.tether/view/RUN).")]
    = None,
    model: Annotated[Path | None, typer.Option(help="A model folder: response tokens shown as its tokenizer's "
                                                    "text.")] = None,
    port: Annotated[int | None, typer.Option(help="Default 8765 (TETHER_VIEW_PORT).")] = None,
    host: Annotated[str | None, typer.Option(help="Default 127.0.0.1 (TETHER_VIEW_HOST).")] = None,
    follow: Annotated[bool | None, typer.Option(help="Keep reading the topics (live runs).")] = None,
) -> None:
    """A web page for runs: curves, rollouts, task groups side by side, trajectories with token logprobs. It
    reads the topics (Kafka: TETHER_BUS_*) into its own store, so it shows live and replayed runs alike."""
    import uvicorn

    from analytics.view.app import create_app
    from analytics.view.settings import ViewSettings
    from schemas.settings import BusSettings
    from stream_processors.errors import ProcessorError

    settings = load_settings(ViewSettings, run_id=run, dsn=dsn, model=model, port=port, host=host, follow=follow)
    if settings.model is not None and not (settings.model / "config.json").exists():
        fail(f"--model: {settings.model} is not a model folder (no config.json)", 2)
    try:
        app = create_app(settings, load_settings(BusSettings))
    except ProcessorError as exc:
        fail(str(exc))
    console.print(f"tether view: http://{settings.host}:{settings.port}/", highlight=False)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level="warning")
