"""The page's store: the analytics tables, plus every call's content, projected from the run's topics.

The analytics rows are the sink's (`analytics.sink.rows_for`), plus the
advantages each update gave its rollouts (`given_advantages`); calls are
kept as recorded (an extending call as its difference), and made whole when a
trajectory is read. Rows are ReplacingMergeTree by their own id, so reading the
topics again from the start stores nothing twice. Where the projection had read
to is stored after each batch's rows (`view_positions`, per reader: the run it
keeps), so a restarted view reads on from there instead of from the start.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TypeAlias

from clickhouse_connect.driver.client import Client

from analytics.errors import QueryFailed, WriteFailed
from analytics.sink import Sink, connect
from schemas.events import Event, ModelCall, TrainerStep, run_of

CONTENTS = """
CREATE TABLE IF NOT EXISTS call_contents (
    run_id String, rollout_id String, call_id String, seq UInt32, choice_index UInt32, request_json String,
    response_json String, response_token_ids Array(UInt32), response_logprobs Array(Float64),
    extends Nullable(String), request_head UInt64, request_tail UInt64,
    weight_version Int64, status String, error Nullable(String), engine_ms Float64, queued_ms Float64,
    received_at DateTime64(6, 'UTC'), finished_at DateTime64(6, 'UTC')
) ENGINE = ReplacingMergeTree ORDER BY (run_id, rollout_id, call_id)
"""
POSITIONS = """
CREATE TABLE IF NOT EXISTS view_positions (
    reader String, topic String, partition UInt32, next_offset UInt64, written DateTime64(6, 'UTC')
) ENGINE = ReplacingMergeTree(written) ORDER BY (reader, topic, partition)
"""
GIVEN = """
CREATE TABLE IF NOT EXISTS given_advantages (
    run_id String, version Int64, group_id String, rollout_id String, advantage Float64,
    call_seqs Array(UInt32), call_advantages Array(Float64)
) ENGINE = ReplacingMergeTree ORDER BY (run_id, group_id, rollout_id)
"""
Positions: TypeAlias = Mapping[tuple[str, int], int]  # (topic, partition) -> the next offset to read
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


def reader(run_id: str | None) -> str:
    return f"run {run_id}" if run_id is not None else "every run"


class ViewStore:
    """One client, used by the projection and the pages in turn (chdb is one session per process)."""

    def __init__(self, dsn: str) -> None:
        self.client: Client = connect(dsn)
        self.lock = threading.Lock()
        with self.lock:
            self.client.command(CONTENTS)
            self.client.command(POSITIONS)
            self.client.command(GIVEN)
        self._sink = Sink(self.client)
        self._contents: list[list[Any]] = []
        self._given: list[list[Any]] = []  # what each update gave each rollout (TrainerStep.advantages)

    def add(self, events: Sequence[Event], run_id: str | None, read_to: Positions | None = None) -> int:
        """Store the events (of `run_id` only, when given), then, once they are stored, `read_to`: where the
        reader of that run stands. Returns the rows written."""
        for event in events:
            if run_id is not None and run_of(event) != run_id:
                continue
            self._sink.add(event)
            if isinstance(event, ModelCall):
                self._contents.append(content_row(event))
            elif isinstance(event, TrainerStep):
                self._given += [[event.run_id, event.version, a.group_id, a.rollout_id, a.advantage,
                                 [c.seq for c in a.calls], [c.advantage for c in a.calls]] for a in event.advantages]
        with self.lock:
            written = self._sink.flush()
            if self._contents:
                self._insert("call_contents", self._contents, CONTENT_COLUMNS)
                written += len(self._contents)
                self._contents = []
            if self._given:
                self._insert("given_advantages", self._given, ["run_id", "version", "group_id", "rollout_id",
                                                               "advantage", "call_seqs", "call_advantages"])
                written += len(self._given)
                self._given = []
            if read_to:
                now = datetime.now(UTC)
                self._insert("view_positions", [[reader(run_id), topic, partition, offset, now]
                                                for (topic, partition), offset in read_to.items()],
                             ["reader", "topic", "partition", "next_offset", "written"])
        return written

    def positions(self, run_id: str | None) -> dict[tuple[str, int], int]:
        """Where the reader of `run_id` (every run: None) last stood, by the latest record of each partition: a
        topic made anew starts lower than before."""
        rows = self.rows("SELECT topic, partition, argMax(next_offset, written) AS next FROM view_positions "
                         "WHERE reader = {reader:String} GROUP BY topic, partition", reader=reader(run_id))
        return {(r["topic"], int(r["partition"])): int(r["next"]) for r in rows}

    def _insert(self, table: str, rows: list[list[Any]], columns: list[str]) -> None:
        try:
            self.client.insert(table, rows, column_names=columns)
        except Exception as exc:  # clickhouse-connect and chdb raise their own trees
            raise WriteFailed(f"inserting {len(rows)} rows into {table}: {exc}") from exc

    def rows(self, sql: str, **parameters: Any) -> list[dict[str, Any]]:
        with self.lock:
            try:
                result = self.client.query(sql, parameters=parameters)
            except Exception as exc:
                raise QueryFailed(f"query failed: {exc}") from exc
        return [dict(zip(result.column_names, row, strict=True)) for row in result.result_rows]
