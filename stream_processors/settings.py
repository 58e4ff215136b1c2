"""How the stream processors run; read once from TETHER_PROCESSOR_* (and TETHER_BUS_* for Kafka)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from schemas.settings import BusSettings


class ProcessorSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TETHER_PROCESSOR_", frozen=True)

    app_id: str = Field("tether-processor", description="Consumer group and prefix of the tables' changelogs.")
    run_id: str | None = Field(None, description="Only this run's events (default: every run on the topics).")
    failed: Literal["drop", "fill"] = Field("drop", description="Failed/timed-out rollouts: drop, or fill.")
    fill_reward: float = Field(0.0, description="The reward a kept failed rollout gets with failed=fill.")
    group_timeout_s: float = Field(1800.0, gt=0, description="Then a group that never completed goes out partial.")
    check_interval_s: float = Field(5.0, gt=0)
    clickhouse_dsn: str | None = Field(
        "chdb://.tether/clickhouse", description="Analytics sink: chdb://PATH (in process; relative paths are "
        "taken from the working folder) or a ClickHouse URL; "
        "empty to turn the sink off.")
    sink_batch: int = Field(1000, ge=1, description="Rows per insert at most.")
    sink_flush_s: float = Field(1.0, gt=0, description="Insert at least this often while rows arrive.")
    join_batch: int = Field(500, ge=1, description="Events the join takes at a time at most.")
    join_batch_s: float = Field(0.02, gt=0, description="How long the join waits to fill a batch.")
    stream_buffer: int = Field(
        2048, ge=1, description="Records fetched ahead of each agent at most (a whole call recorded at 32k tokens "
        "is about 250 KB; one recorded as what it adds, a few KB).")
    call_cache_mb: int = Field(
        512, ge=1, description="Calls of open rollouts held in memory; past it the oldest rollouts' calls are "
        "dropped, and read back from tether.calls when those rollouts complete.")
    standby_replicas: int = Field(
        1, ge=0, description="Workers that keep a warm copy of each table partition another worker owns (Faust's "
        "standby replicas): a rebalance after a worker dies resumes from it at once, at the cost of every worker "
        "also applying the others' changelogs.")
    data_dir: Path = Field(Path(".tether/processor"), description="Faust's local state.")
    bus: BusSettings = Field(default_factory=BusSettings)
