"""A reward command's output → a number. A missing or unparsable reward is an error with the reason."""

from __future__ import annotations

import json
import math

from controller.errors import RewardError


def parse_reward(output: str) -> float:
    """The last non-empty line: a number, or a JSON object with a numeric `reward`."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    if not lines:
        raise RewardError("the reward command printed nothing")
    last = lines[-1]
    try:
        value = json.loads(last)
    except json.JSONDecodeError:
        raise RewardError(f"the reward command's last line is not a number or JSON: {last[:200]!r}") from None
    if isinstance(value, dict):
        if "reward" not in value:
            raise RewardError(f"the reward command's JSON has no 'reward': {last[:200]!r}")
        value = value["reward"]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RewardError(f"the reward is not a number: {value!r}")
    if not math.isfinite(value):
        raise RewardError(f"the reward is not finite: {value!r}")
    return float(value)
