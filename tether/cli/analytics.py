"""`tether analytics` and `tether view`: a run's analytics tables printed and plotted, and its web page."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from tether.cli.support import console, fail, load_settings


def analytics(
    run: Annotated[str, typer.Option("--run", help="The run id.")],
    dsn: Annotated[str | None, typer.Option(help="ClickHouse DSN (default: TETHER_PROCESSOR_CLICKHOUSE_DSN if set, "
                                                 "else the sink of `tether up`'s run folder if there is one).")]
    = None,
    out: Annotated[Path, typer.Option(help="Where to write the plot.")] = Path(".tether/analytics"),
) -> None:
    """Reward per weight version, tokens and calls per rollout, gateway latency, staleness, failures."""
    from analytics.errors import AnalyticsError
    from analytics.report import plot, print_results, run_queries
    from analytics.sink import connect
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
    except AnalyticsError as exc:
        fail(str(exc))
    print_results(results, run, Console(width=max(130, shutil.get_terminal_size().columns)))
    typer.echo(f"plot: {plot(results, run, out / f'{run}.png')}", err=True)


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
    from analytics.errors import AnalyticsError
    from analytics.view.serve import serve
    from analytics.view.settings import ViewSettings
    from schemas.settings import BusSettings

    settings = load_settings(ViewSettings, run_id=run, dsn=dsn, model=model, port=port, host=host, follow=follow)
    if settings.model is not None and not (settings.model / "config.json").exists():
        fail(f"--model: {settings.model} is not a model folder (no config.json)", 2)
    try:
        serve(settings, load_settings(BusSettings), lambda line: console.print(line, highlight=False))
    except AnalyticsError as exc:
        fail(str(exc))
