"""Errors of analytics: the sink's tables, `tether analytics` and `tether view`'s store.

ClickHouse (clickhouse-connect or chdb) raises its own trees; they become these where analytics calls it.

    AnalyticsError
    ├── ConnectFailed   ClickHouse refused the connection or the tables' creation
    ├── WriteFailed     an insert into a table failed
    └── QueryFailed     a query failed
"""

from __future__ import annotations


class AnalyticsError(Exception):
    pass


class ConnectFailed(AnalyticsError):
    pass


class WriteFailed(AnalyticsError):
    pass


class QueryFailed(AnalyticsError):
    pass
