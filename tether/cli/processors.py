"""`tether processors run`: the Faust worker that joins calls to rollouts and publishes task groups."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Annotated

import typer

from tether.cli.support import failing_cleanly, load_settings

processors_app = typer.Typer(help="Stream processors: calls joined to rollouts, task groups, analytics sink.",
                             no_args_is_help=True)


@processors_app.command("run")
def processors_run(
    run_id: Annotated[str | None, typer.Option("--run", help="Only this run's events.")] = None,
) -> None:
    """Join, group and sink until interrupted (settings: TETHER_PROCESSOR_*, Kafka: TETHER_BUS_*)."""
    from faust.worker import Worker

    from infra.health import BEAT_EVERY_S, beat, beat_file
    from schemas.admin import ensure_topics
    from stream_processors.app import create_app, internal_topics
    from stream_processors.settings import ProcessorSettings

    settings = load_settings(ProcessorSettings, run_id=run_id)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    with failing_cleanly():
        asyncio.run(ensure_topics(settings.bus, internal_topics(settings)))
    app = create_app(settings)

    async def health() -> None:  # what the processors' image's health check reads (infra.health)
        with contextlib.suppress(OSError):
            await asyncio.to_thread(beat, beat_file("processors"))

    app.timer(BEAT_EVERY_S)(health)
    worker = Worker(app, loglevel="info", quiet=True)
    # Faust's progress spinner puts the root logger at DEBUG so that it spins on every record: every library's
    # debug message was built and dropped (aiokafka writes several per request). The processors' own info shows.
    worker.spinner = None
    for name in ("faust", "mode", "aiokafka", "clickhouse_connect", "stream_processors.recovery"):
        logging.getLogger(name).setLevel(logging.WARNING)
    worker.execute_from_commandline()
