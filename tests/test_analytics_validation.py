"""Held-out validation in analytics: the sink's rows, `validation_per_version`, training figures that leave the
validation rollouts out, a store made before validation given its columns, and the run's pages (chdb in this
process and FastAPI's test client: no Kafka, no browser)."""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import clickhouse_connect
import pytest
from clickhouse_connect.driver.client import Client
from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from fastapi.testclient import TestClient

import analytics.view
from analytics.report import QUERIES, by_setting
from analytics.sink import COLUMNS, SCHEMA, Sink, connect, query, rows_for, statements
from analytics.view.pages import router
from analytics.view.reads import RunReads
from analytics.view.store import ViewStore
from schemas import events as ev
from tests.factories import examples
from tests.test_view import VALIDATION, recorded_run

#: the two tables validation changed, as they were made before it
BEFORE_VALIDATION = """
CREATE TABLE IF NOT EXISTS rollouts (
    run_id String, rollout_id String, group_id String, task_id String, attempt UInt32,
    retry_of Nullable(String), runner LowCardinality(String), weight_version Int64,
    started_at DateTime64(6, 'UTC')
) ENGINE = ReplacingMergeTree ORDER BY (run_id, rollout_id);
CREATE TABLE IF NOT EXISTS weight_versions (
    run_id String, version Int64, checkpoint_path Nullable(String), published_at DateTime64(6, 'UTC')
) ENGINE = ReplacingMergeTree ORDER BY (run_id, version);
"""
REWARD_CHART = "reward by sampling weight version (± spread)"


def training_means(events: list[ev.Event]) -> dict[int, float]:
    """Mean reward per weight version (a rollout's first call's) of the rewarded training rollouts."""
    held_out = {e.rollout_id for e in events if isinstance(e, ev.RolloutStarted) and e.validation}
    first: dict[str, int] = {}
    for e in events:
        if isinstance(e, ev.ModelCall):
            first[e.rollout_id] = min(first.get(e.rollout_id, e.weight_version), e.weight_version)
    rewards: dict[int, list[float]] = defaultdict(list)
    for e in events:
        if isinstance(e, ev.RolloutFinished) and e.reward is not None and e.rollout_id not in held_out:
            rewards[first[e.rollout_id]].append(e.reward)
    return {v: statistics.fmean(r) for v, r in sorted(rewards.items())}


def reported(events: list[ev.Event]) -> list[tuple[int, str, int, float]]:
    """(version, setting, rollouts, mean reward) of every validation report, by version then setting."""
    return sorted((e.version, s.setting, s.rollouts, s.mean_reward) for e in events
                  if isinstance(e, ev.ValidationReported) for s in e.scores)


@pytest.fixture
def client(tmp_path: Path) -> Iterator[Client]:
    client = connect(f"chdb://{tmp_path / 'sink'}")
    try:
        yield client
    finally:
        client.close()  # chdb: one folder per process at a time


def sunk(client: Client, events: list[ev.Event]) -> int:
    sink = Sink(client)
    for event in events:
        sink.add(event)
    return sink.flush()


def rows_of(client: Client, name: str, run_id: str) -> list[dict[str, Any]]:
    columns, rows = query(client, name, run_id)
    return [dict(zip(columns, row, strict=True)) for row in rows]


def test_every_event_fills_its_tables_columns_and_a_report_is_a_row_per_setting() -> None:
    for event in examples():
        for table, row in rows_for(event):
            assert len(row) == len(COLUMNS[table]), (table, row)
    report = next(e for e in examples() if isinstance(e, ev.ValidationReported))
    rows = rows_for(report)
    assert [table for table, _ in rows] == ["validation_scores"] * len(report.scores) and len(rows) == 2
    named = [dict(zip(COLUMNS["validation_scores"], row, strict=True)) for _, row in rows]
    assert [(r["setting"], r["temperature"], r["rollouts"], r["mean_reward"]) for r in named] == [
        (s.setting, s.temperature, s.rollouts, s.mean_reward) for s in report.scores]
    started = ev.RolloutStarted(rollout_id="r", run_id="x", group_id="g", task_id="t", task_json="{}", group_size=1,
                                validation=True, temperature=0.7)
    ((table, row),) = rows_for(started)
    assert dict(zip(COLUMNS[table], row, strict=True))["validation"] is True
    assert dict(zip(COLUMNS[table], row, strict=True))["temperature"] == 0.7
    assert rows_for(ev.ValidationStarted(run_id="x", version=0, rollouts=3)) == []


def test_the_schemas_statements_leave_out_what_is_only_comments() -> None:
    sql = "-- heading\nCREATE TABLE a (x UInt8)\n;\n-- a note alone\n;ALTER TABLE a ADD COLUMN IF NOT EXISTS y UInt8;\n"
    assert statements(sql) == ["-- heading\nCREATE TABLE a (x UInt8)", "ALTER TABLE a ADD COLUMN IF NOT EXISTS y UInt8"]
    assert all(re.search(r"^(CREATE|ALTER) TABLE", s, re.M) for s in statements(SCHEMA.read_text()))


def test_validation_per_version_and_training_reward_without_the_held_out(client: Client) -> None:
    events = recorded_run("with-val", validation=True)
    assert sunk(client, events) > 0
    got = rows_of(client, "validation_per_version", "with-val")
    assert [(r["version"], r["setting"], r["rollouts"], r["mean_reward"]) for r in got] == [
        (v, s, n, pytest.approx(m, abs=1e-4)) for v, s, n, m in reported(events)]
    training = rows_of(client, "reward_per_version", "with-val")
    assert {r["weight_version"]: r["mean_reward"] for r in training} == {
        v: pytest.approx(m, abs=1e-4) for v, m in training_means(events).items()}
    assert max(VALIDATION) not in {r["weight_version"] for r in training}  # validated only: no training point
    assert rows_of(client, "validation_per_version", "no-such-run") == []


def test_a_store_made_before_validation_gets_its_columns_and_keeps_its_rows(tmp_path: Path) -> None:
    dsn = f"chdb://{tmp_path / 'old'}"
    old = clickhouse_connect.get_client(dsn=dsn)
    for statement in statements(BEFORE_VALIDATION):
        old.command(statement)
    earlier = next(e for e in recorded_run("earlier") if isinstance(e, ev.RolloutStarted))
    old.insert("rollouts", [rows_for(earlier)[0][1][:9]], column_names=COLUMNS["rollouts"][:9])
    old.close()

    client = connect(dsn)
    try:
        for table in ("rollouts", "weight_versions"):
            have = {r[0] for r in client.query("SELECT name FROM system.columns WHERE database = currentDatabase() "
                                               "AND table = {t:String}", parameters={"t": table}).result_rows}
            assert set(COLUMNS[table]) <= have, table
        kept = client.query("SELECT rollout_id, validation, temperature FROM rollouts FINAL").result_rows
        assert kept == [(earlier.rollout_id, False, None)]  # a row from before: a training rollout
        events = recorded_run("later", validation=True)
        assert sunk(client, events) > 0
        assert len(rows_of(client, "validation_per_version", "later")) == len(reported(events))
        finals = client.query("SELECT version FROM weight_versions FINAL WHERE final").result_rows
        assert finals == [(e.version,) for e in events if isinstance(e, ev.WeightVersionPublished) and e.final]
    finally:
        client.close()
    connect(dsn).close()  # once more: the columns it adds are there already


def test_tether_analytics_runs_and_plots_validation_by_setting(client: Client) -> None:
    events = recorded_run("with-val", validation=True)
    sunk(client, events)
    assert "validation_per_version" in QUERIES
    curves = by_setting(query(client, "validation_per_version", "with-val"))
    expected: dict[str, list[tuple[int, Any]]] = defaultdict(list)  # (version, approximate mean)
    for version, setting, _, mean in reported(events):
        expected[setting].append((version, pytest.approx(mean, abs=1e-4)))
    assert {setting: list(zip(*curve, strict=True)) for setting, curve in curves.items()} == expected


@pytest.fixture
def pages(tmp_path: Path) -> Iterator[TestClient]:
    """The view's routes over a store holding a run with validation (`with-val`) and one without (`no-val`)."""
    store = ViewStore(f"chdb://{tmp_path / 'store'}")
    try:
        store.add(recorded_run("with-val", validation=True), None)
        store.add(recorded_run("no-val", seed=1), None)
        app = FastAPI()
        app.mount("/static", StaticFiles(directory=Path(analytics.view.__file__).parent / "static"), name="static")
        app.include_router(router(RunReads(store)))
        yield TestClient(app)
    finally:
        store.client.close()


def figure(html: str, title: str) -> str:
    """The SVG figure of the chart titled `title` on a page."""
    found = re.search(rf'<figure class="chart" data-chart="{re.escape(title)}">.*?</figure>', html, re.S)
    assert found, title
    return found.group(0)


def test_the_run_page_shows_validation_beside_training_reward(pages: TestClient) -> None:
    events = recorded_run("with-val", validation=True)
    html = pages.get("/runs/with-val").text
    chart = figure(html, REWARD_CHART)
    settings = sorted({s for _, s, _, _ in reported(events)})
    assert re.findall(r"<span><i [^>]*></i>([^<]+)</span>", chart) == ["training",
                                                                       *(f"validation: {s}" for s in settings)]
    assert chart.count("stroke-dasharray") == len(settings)  # a dashed line per setting
    points = re.findall(r"<title>(validation: [^ ]+) at (\d+): ([\d.]+)</title>", chart)
    assert sorted((int(v), name.removeprefix("validation: "), float(m)) for name, v, m in points) == sorted(
        (v, s, round(m, 4)) for v, s, _, m in reported(events))
    assert re.findall(r"<title>training at (\d+):", chart) == [str(v) for v in training_means(events)]
    table = re.search(r'<table class="data" id="validation">.*?</table>', html, re.S)
    assert table and table.group(0).count("<tr>") == 1 + len(reported(events))
    held_out = sum(isinstance(e, ev.RolloutStarted) and e.validation for e in events)
    assert f"{held_out} held-out validation rollouts" in html


def test_a_run_without_validation_shows_no_validation_at_all(pages: TestClient) -> None:
    html = pages.get("/runs/no-val").text
    chart = figure(html, REWARD_CHART)
    assert "legend" not in chart and "stroke-dasharray" not in chart and chart.count("<circle") == 2
    assert "validation" not in html.lower()
    curves = pages.get("/api/runs/no-val/curves").json()
    assert curves["validation_by_version"] == {} and curves["validation"] == []


def test_training_figures_leave_the_validation_rollouts_out(pages: TestClient) -> None:
    events = recorded_run("with-val", validation=True)
    curves = pages.get("/api/runs/with-val/curves").json()
    assert {v: m for v, m, _ in curves["reward_by_version"]} == {
        v: pytest.approx(m, abs=1e-4) for v, m in training_means(events).items()}
    summary = {r["run_id"]: r for r in pages.get("/api/runs").json()}["with-val"]
    training = [e for e in events if isinstance(e, ev.RolloutStarted) and not e.validation]
    held_out = [e for e in events if isinstance(e, ev.RolloutStarted) and e.validation]
    assert summary["rollouts"] == len(training) and summary["validation_rollouts"] == len(held_out)
    rewards = [e.reward for e in events if isinstance(e, ev.RolloutFinished) and e.reward is not None
               and e.rollout_id in {t.rollout_id for t in training}]
    assert summary["mean_reward"] == pytest.approx(statistics.fmean(rewards))


def test_validation_rollouts_are_marked_and_filtered(pages: TestClient) -> None:
    events = recorded_run("with-val", validation=True)
    started = {e.rollout_id: e for e in events if isinstance(e, ev.RolloutStarted)}
    api = "/api/runs/with-val/rollouts"
    held_out = pages.get(api, params={"validation": "true"}).json()
    assert {r["rollout_id"] for r in held_out} == {r for r, e in started.items() if e.validation}
    assert all(r["validation"] and r["temperature"] == started[r["rollout_id"]].temperature for r in held_out)
    training = pages.get(api, params={"validation": "false"}).json()
    assert {r["rollout_id"] for r in training} == {r for r, e in started.items() if not e.validation}
    assert len(pages.get(api, params={"validation": ""}).json()) == len(started)

    html = pages.get("/runs/with-val/rollouts").text
    marked = re.findall(r'<tr class="status-\w+ validation"><td class="id"><a [^>]*>([^<]+)</a> '
                        r'<span class="badge"', html)
    assert sorted(marked) == sorted(r["rollout_id"] for r in held_out)
    one = held_out[0]
    group = pages.get(f"/api/runs/with-val/groups/{one['group_id']}").json()
    assert group["validation"] and all(m["advantage"] is None for m in group["members"])  # never trained on
    assert 'id="validation"' in pages.get(f"/runs/with-val/groups/{one['group_id']}").text
    assert 'id="validation"' in pages.get(f"/runs/with-val/rollouts/{one['rollout_id']}").text
    assert 'id="validation"' not in pages.get(f"/runs/with-val/rollouts/{training[0]['rollout_id']}").text
