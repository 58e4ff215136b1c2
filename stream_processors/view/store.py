"""The page's store: the analytics tables, plus every call's content, projected from the run's topics.

The analytics rows are the sink's (`stream_processors.sink.row_for`); calls are
kept as recorded (an extending call as its difference), and made whole when a
trajectory is read. Rows are ReplacingMergeTree by their own id, so reading the
topics again from the start stores nothing twice.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from clickhouse_connect.driver.client import Client

from schemas.events import Event, ModelCall, run_of
from stream_processors.errors import AnalyticsError
from stream_processors.sink import Sink, connect

CONTENTS = """
CREATE TABLE IF NOT EXISTS call_contents (
    run_id String, rollout_id String, call_id String, seq UInt32, choice_index UInt32, request_json String,
    response_json String, response_token_ids Array(UInt32), response_logprobs Array(Float64),
    extends Nullable(String), request_head UInt64, request_tail UInt64,
    weight_version Int64, status String, error Nullable(String), engine_ms Float64, queued_ms Float64,
    received_at DateTime64(6, 'UTC'), finished_at DateTime64(6, 'UTC')
) ENGINE = ReplacingMergeTree ORDER BY (run_id, rollout_id, call_id)
"""
CONTENT_COLUMNS = ["run_id", "rollout_id", "call_id", "seq", "choice_index", "request_json", "response_json",
                   "response_token_ids", "response_logprobs", "extends", "request_head",
                   "request_tail", "weight_version", "status", "error", "engine_ms", "queued_ms", "received_at",
                   "finished_at"]


def content_row(call: ModelCall) -> list[Any]:
    t = call.timings
    return [call.run_id, call.rollout_id, call.call_id, call.seq, call.choice_index, call.request_json,
            call.response_json, call.response_token_ids, call.response_logprobs, call.extends, call.request_head,
            call.request_tail, call.weight_version, call.status, call.error, t.engine_ms, t.queued_ms,
            t.received_at, t.finished_at]


class ViewStore:
    """One client, used by the projection and the pages in turn (chdb is one session per process)."""

    def __init__(self, dsn: str) -> None:
        self.client: Client = connect(dsn)
        self.lock = threading.Lock()
        with self.lock:
            self.client.command(CONTENTS)
        self._sink = Sink(self.client)
        self._contents: list[list[Any]] = []

    def add(self, events: Sequence[Event], run_id: str | None) -> int:
        """Store the events (of `run_id` only, when given); returns the rows written."""
        for event in events:
            if run_id is not None and run_of(event) != run_id:
                continue
            self._sink.add(event)
            if isinstance(event, ModelCall):
                self._contents.append(content_row(event))
        with self.lock:
            written = self._sink.flush()
            if self._contents:
                try:
                    self.client.insert("call_contents", self._contents, column_names=CONTENT_COLUMNS)
                except Exception as exc:  # clickhouse-connect and chdb raise their own trees
                    raise AnalyticsError(f"inserting {len(self._contents)} call contents: {exc}") from exc
                written += len(self._contents)
                self._contents = []
        return written

    def rows(self, sql: str, **parameters: Any) -> list[dict[str, Any]]:
        with self.lock:
            try:
                result = self.client.query(sql, parameters=parameters)
            except Exception as exc:
                raise AnalyticsError(f"query failed: {exc}") from exc
        return [dict(zip(result.column_names, row, strict=True)) for row in result.result_rows]
