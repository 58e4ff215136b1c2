"""Errors of `tether repro`: a controller run's errors, and this one.

    ControllerError (controller.errors)
    └── ReproError   the recorded run cannot be run again: nothing chosen, a version without its checkpoint, no
                     base for version 0, or an engine that refused the hand-over
"""

from __future__ import annotations

from controller.errors import ControllerError


class ReproError(ControllerError):
    pass
