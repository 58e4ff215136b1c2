"""Reading a service's YAML configuration file: one mapping, validated by the service's pydantic model.

Shared so that every service reports a bad file the same way: the file, then the first field at fault.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from schemas.validation import first_error

Model = TypeVar("Model", bound=BaseModel)


def load_model(path: Path, model: type[Model], error: type[Exception],
               prepare: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> Model:
    """The file's mapping (after `prepare`) as `model`; failures raise the service's own `error`."""
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise error(f"{path}: cannot read: {exc}") from exc
    if not isinstance(raw, dict):
        raise error(f"{path}: expected a mapping of settings")
    try:
        return model.model_validate(prepare(raw) if prepare else raw)
    except ValidationError as exc:
        raise error(f"{path}: {first_error(exc).line('(top level)')}") from exc
