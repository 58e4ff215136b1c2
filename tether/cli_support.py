"""What every `tether` command shares: one-line errors, settings read once with the variable named."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NoReturn, TypeVar

import typer
from pydantic import ValidationError
from pydantic_settings import BaseSettings
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from schemas.validation import first_error

console = Console(stderr=True)
S = TypeVar("S", bound=BaseSettings)


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
