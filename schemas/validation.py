"""A pydantic validation error as one line: the first problem, with the field it is about.

Every service reports bad input (a request body, a settings variable, a YAML
file) by the field a person has to fix; each one wraps this in its own
protocol or error type.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError


@dataclass(frozen=True, slots=True)
class FirstError:
    field: str | None  # dotted location, None when the problem is the whole input
    message: str
    type: str

    def line(self, top_level: str | None = None) -> str:
        """`field: message`, or the message alone (after `top_level` if given) for the whole input."""
        where = self.field or top_level
        return f"{where}: {self.message}" if where else self.message


def first_error(errors: ValidationError | Sequence[Any], skip: Iterable[str | int] = ()) -> FirstError:
    """The first error of a pydantic (or FastAPI request) validation; `skip` drops location parts such as
    FastAPI's leading "body"."""
    found = errors.errors() if isinstance(errors, ValidationError) else list(errors)
    if not found:
        return FirstError(None, "invalid input", "")
    first = found[0]
    dropped = set(skip)
    field = ".".join(str(p) for p in first.get("loc", ()) if p not in dropped) or None
    return FirstError(field, str(first.get("msg", "invalid input")), str(first.get("type", "")))
