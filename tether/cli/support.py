"""What every `tether` command shares: one-line errors, settings read once with the variable named, services run
under a progress bar."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import typer
from pydantic import ValidationError
from pydantic_settings import BaseSettings
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from schemas.validation import first_error

console = Console(stderr=True)
S = TypeVar("S", bound=BaseSettings)
C = TypeVar("C")
T = TypeVar("T")


def fail(message: str, code: int = 1) -> NoReturn:
    typer.echo(f"tether: {message}", err=True)
    raise typer.Exit(code)


@contextmanager
def failing_cleanly() -> Iterator[None]:
    """Our own errors become one unwrapped line on stderr and exit code 1, never a traceback."""
    from infra.errors import InfraError
    from schemas.errors import BusError

    try:
        yield
    except (InfraError, BusError) as exc:
        fail(str(exc))


def load_settings(cls: type[S], **overrides: Any) -> S:
    """Settings from the environment (and flags); a bad value is named by its variable, in one line."""
    try:
        return cls(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        first = first_error(exc)
        field = first.field or ""
        prefix = str(cls.model_config.get("env_prefix", ""))
        fail(f"{prefix}{field.upper()} (or --{field.replace('_', '-')}): {first.message}", 2)



def progress_bar(on: Console | None = None) -> Progress:
    """A bar with a count and a free-text `detail` field, on stderr (or `on`)."""
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[detail]}"), TimeElapsedColumn(), console=on or console)


def config_or_exit(load: Callable[[Path], C], path: Path, error: type[Exception]) -> C:
    """A service's YAML file; an invalid one exits 2 with the error (it names the file and the field)."""
    try:
        return load(path)
    except error as exc:
        fail(str(exc), 2)


def run_with_bar(title: str, total: int | None, detail: str, error: type[Exception],
                  main: Callable[[Callable[..., None]], Coroutine[Any, Any, T]], beat: str | None = None) -> T:
    """Run a service to its end under a progress bar; `main` gets the bar's update. Its own errors (`error`) and
    the bus's become one line on stderr and exit code 1. `beat`: the role whose health file its loop keeps fresh
    meanwhile (`infra.health`, what its image's health check reads)."""
    from infra.health import beating_while

    progress = progress_bar()
    bar = progress.add_task(title, total=total, detail=detail)
    with failing_cleanly(), progress:
        try:
            work = main(functools.partial(progress.update, bar))
            return asyncio.run(beating_while(beat, work) if beat is not None else work)
        except error as exc:
            fail(str(exc))
