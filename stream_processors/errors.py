"""Errors of the stream processors.

    ProcessorError
    ├── AnalyticsError   ClickHouse refused a connection, a table, an insert or a query
    └── ReplayError      the topics cannot be read back for a replay
"""

from __future__ import annotations


class ProcessorError(Exception):
    pass


class AnalyticsError(ProcessorError):
    pass


class ReplayError(ProcessorError):
    pass
