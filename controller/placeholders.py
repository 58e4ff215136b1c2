"""`{task.field}`, `{rollout_id}`, `{run_id}`, `{task_id}`, `{attempt}` in argv, environment and Job templates.

Only these names are replaced, so other braces (JSON in an argument) pass
through; a `{task.field}` the task lacks is an error naming the field, not an
empty string handed to the harness.
"""

from __future__ import annotations

import json
import re
from typing import Any

from controller.errors import ConfigError

_PLACEHOLDER = re.compile(r"\{(task(?:\.[A-Za-z0-9_-]+)+|rollout_id|run_id|task_id|group_id|attempt)\}")


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def fill(template: str, values: dict[str, Any], task: dict[str, Any]) -> str:
    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if not name.startswith("task."):
            return _text(values[name])
        value: Any = task
        for part in name.split(".")[1:]:
            if not isinstance(value, dict) or part not in value:
                raise ConfigError(f"placeholder {{{name}}}: task {task.get('id')!r} has no field {part!r}")
            value = value[part]
        return _text(value)

    return _PLACEHOLDER.sub(one, template)


def fill_all(obj: Any, values: dict[str, Any], task: dict[str, Any]) -> Any:
    """Every string inside lists and mappings (a Job manifest) filled."""
    if isinstance(obj, str):
        return fill(obj, values, task)
    if isinstance(obj, list):
        return [fill_all(x, values, task) for x in obj]
    if isinstance(obj, dict):
        return {k: fill_all(v, values, task) for k, v in obj.items()}
    return obj
