"""Errors of the stream processors.

    ProcessorError
    └── ReplayError      the topics cannot be read back for a replay
"""

from __future__ import annotations


class ProcessorError(Exception):
    pass


class ReplayError(ProcessorError):
    pass
