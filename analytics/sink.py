"""Events → rows of the analytics tables (analytics/clickhouse/schema.sql), written in batches via clickhouse-connect.

The DSN picks the backend with the same code: `chdb://PATH` runs ClickHouse in
this process (chdb) on PATH, `http://host:8123/db` talks to a server. chdb
holds its directory while the sink runs; query it after, or use a server.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import clickhouse_connect
from clickhouse_connect.driver.client import Client

from analytics.errors import ConnectFailed, QueryFailed, WriteFailed
from schemas.events import (
    Event,
    ModelCall,
    RolloutFinished,
    RolloutStarted,
    TaskGroup,
    TrainerStep,
    ValidationReported,
    WeightVersionPublished,
)

SCHEMA = Path(__file__).parent / "clickhouse" / "schema.sql"
QUERIES = SCHEMA.parent / "queries"
COLUMNS = {
    "calls": ["run_id", "rollout_id", "call_id", "seq", "choice_index", "api", "model", "status", "http_status",
              "finish_reason", "prompt_tokens", "completion_tokens", "weight_version", "engine_ms", "queued_ms",
              "latency_ms", "received_at"],
    "rollouts": ["run_id", "rollout_id", "group_id", "task_id", "attempt", "retry_of", "runner", "weight_version",
                 "started_at", "validation", "temperature", "seed"],
    "rollout_results": ["run_id", "rollout_id", "status", "reward", "exit_code", "duration_s", "reason",
                        "finished_at"],
    "task_groups": ["run_id", "group_id", "task_id", "group_size", "rollouts", "dropped", "partial",
                    "trainable_tokens", "mean_reward", "min_version", "max_version", "created_at"],
    "weight_versions": ["run_id", "version", "checkpoint_path", "published_at", "final"],
    "updates": ["run_id", "version", "task_groups", "tokens", "mean_reward", "loss", "entropy", "clip_fraction",
                "kl", "grad_norm", "staleness_mean", "staleness_max", "dropped_stale", "dropped_no_signal",
                "seconds", "stepped_at"],
    "validation_scores": ["run_id", "version", "setting", "temperature", "rollouts", "mean_reward", "unrewarded",
                          "duration_s", "reported_at"],
}


def rows_for(event: Event) -> list[tuple[str, list[Any]]]:
    """Each (table, row) an event becomes, none for events analytics does not keep: a validation report is a row
    per setting it scored."""
    if isinstance(event, ValidationReported):
        return [("validation_scores", [event.run_id, event.version, s.setting, s.temperature, s.rollouts,
                                       s.mean_reward, s.unrewarded, s.duration_s, event.reported_at])
                for s in event.scores]
    found = row_for(event)
    return [] if found is None else [found]


def row_for(event: Event) -> tuple[str, list[Any]] | None:
    """The table and row an event of one row becomes; None for events analytics does not keep, or keeps as
    several rows (`rows_for`)."""
    if isinstance(event, ModelCall):
        t = event.timings
        latency = (t.finished_at - t.received_at).total_seconds() * 1000
        return "calls", [event.run_id, event.rollout_id, event.call_id, event.seq, event.choice_index, event.api,
                         event.model, event.status, event.http_status, event.finish_reason,
                         event.usage.prompt_tokens, event.usage.completion_tokens, event.weight_version,
                         t.engine_ms, t.queued_ms, latency, t.received_at]
    if isinstance(event, RolloutStarted):
        return "rollouts", [event.run_id, event.rollout_id, event.group_id, event.task_id, event.attempt,
                            event.retry_of, event.runner, event.weight_version, event.started_at,
                            event.validation, event.temperature, event.seed]
    if isinstance(event, RolloutFinished):
        return "rollout_results", [event.run_id, event.rollout_id, event.status, event.reward, event.exit_code,
                                   event.duration_s, event.reason, event.finished_at]
    if isinstance(event, TaskGroup):
        versions = [v for r in event.rollouts for s in r.segments
                    for v, m in zip(s.weight_versions, s.loss_mask, strict=True) if m]
        tokens = sum(m for r in event.rollouts for s in r.segments for m in s.loss_mask)
        rewards = [r.reward for r in event.rollouts]
        return "task_groups", [event.run_id, event.group_id, event.task_id, event.group_size, len(event.rollouts),
                               len(event.dropped), event.partial, tokens,
                               sum(rewards) / len(rewards) if rewards else None,
                               min(versions, default=0), max(versions, default=0), event.created_at]
    if isinstance(event, TrainerStep):
        return "updates", [getattr(event, name) for name in COLUMNS["updates"]]
    if isinstance(event, WeightVersionPublished):
        return "weight_versions", [event.run_id, event.version, event.checkpoint_path, event.published_at,
                                   event.final]
    return None


def absolute(dsn: str) -> str:
    """`chdb://relative/path` would read as host and database: make the path absolute."""
    if dsn.startswith("chdb://") and not dsn.startswith("chdb:///"):
        return "chdb://" + str(Path(dsn.removeprefix("chdb://")).resolve())
    return dsn


def statements(sql: str) -> list[str]:
    """The `;`-separated statements of a SQL file, leaving out what holds only comments."""
    def code(part: str) -> bool:
        return any(line.strip() and not line.strip().startswith("--") for line in part.splitlines())

    return [part.strip() for part in sql.split(";") if code(part)]


def connect(dsn: str) -> Client:
    """A client whose tables are as schema.sql has them: made if missing, given the columns added since."""
    dsn = absolute(dsn)
    try:
        client = clickhouse_connect.get_client(dsn=dsn)
        for statement in statements(SCHEMA.read_text()):
            client.command(statement)
    except Exception as exc:  # clickhouse-connect and chdb raise their own trees
        raise ConnectFailed(f"ClickHouse at {dsn}: {exc}") from exc
    return client


class Sink:
    """Collects rows per table; `flush` inserts each table's rows in one statement."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.pending: dict[str, list[list[Any]]] = defaultdict(list)
        self.written = 0

    def add(self, event: Event) -> None:
        for table, row in rows_for(event):
            self.pending[table].append(row)

    def flush(self) -> int:
        n = 0
        for table, rows in list(self.pending.items()):
            if rows:
                try:
                    self.client.insert(table, rows, column_names=COLUMNS[table])
                except Exception as exc:
                    raise WriteFailed(f"inserting {len(rows)} rows into {table}: {exc}") from exc
                n += len(rows)
            del self.pending[table]
        self.written += n
        return n


def query(client: Client, name: str, run_id: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    """One query of analytics/clickhouse/queries/ for a run: column names and rows."""
    try:
        result = client.query((QUERIES / f"{name}.sql").read_text(), parameters={"run": run_id})
    except Exception as exc:
        raise QueryFailed(f"query {name}: {exc}") from exc
    return list(result.column_names), [tuple(r) for r in result.result_rows]
