"""Errors of the controller.

    ControllerError
    ├── ConfigError          the run configuration is invalid (names the field)
    ├── GatewayUnavailable   the gateway's admin API refused or did not answer
    ├── RewardError          a reward is missing or cannot be parsed (the rollout fails with the reason)
    └── LaunchError          the harness could not be started (an infrastructure failure: retried)
"""

from __future__ import annotations


class ControllerError(Exception):
    pass


class ConfigError(ControllerError):
    pass


class GatewayUnavailable(ControllerError):
    pass


class RewardError(ControllerError):
    pass


class LaunchError(ControllerError):
    pass
