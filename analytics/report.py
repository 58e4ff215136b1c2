"""`tether analytics`: the SQL files of analytics/clickhouse/queries/ run for one run, printed and plotted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from clickhouse_connect.driver.client import Client
from rich.console import Console
from rich.table import Table

from analytics.sink import query

QUERIES = ("reward_per_version", "validation_per_version", "tokens_per_rollout", "calls_per_rollout",
           "gateway_latency", "staleness", "failures_by_status", "updates")
Result = tuple[list[str], list[tuple[Any, ...]]]


def run_queries(client: Client, run_id: str) -> dict[str, Result]:
    return {name: query(client, name, run_id) for name in QUERIES}


def print_results(results: dict[str, Result], run_id: str, console: Console) -> None:
    for name, (columns, rows) in results.items():
        title = f"{name.replace('_', ' ')} — run {run_id}"
        if not columns:
            console.print(f"{title}: no rows")
            continue
        table = Table(title=title)
        for column in columns:
            table.add_column(column, justify="right")
        for row in rows:
            table.add_row(*("" if v is None else f"{v:,.4g}" if isinstance(v, float) else str(v) for v in row))
        console.print(table)


def by_setting(result: Result) -> dict[str, tuple[list[Any], list[Any]]]:
    """validation_per_version's rows as one curve per sampling setting: (versions, mean rewards)."""
    columns, rows = result
    curves: dict[str, tuple[list[Any], list[Any]]] = {}
    for row in rows:
        versions, rewards = curves.setdefault(row[columns.index("setting")], ([], []))
        versions.append(row[columns.index("version")])
        rewards.append(row[columns.index("mean_reward")])
    return curves


def plot(results: dict[str, Result], run_id: str, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    (a, b, c), (d, e, f) = axes

    def column(name: str, col: str) -> list[Any]:
        columns, rows = results[name]
        return [r[columns.index(col)] for r in rows] if col in columns else []  # no rows: no column names

    a.plot(column("reward_per_version", "weight_version"), column("reward_per_version", "mean_reward"), "o-",
           label="training")
    validation = by_setting(results["validation_per_version"])
    for setting, (versions, rewards) in validation.items():
        a.plot(versions, rewards, "s--", label=f"validation, {setting}")
    if validation:
        a.legend()
    a.set(title="mean reward per weight version", xlabel="weight version", ylabel="reward")
    names = ["completion_p50", "completion_p90", "completion_max", "completion_mean"]
    values = [column("tokens_per_rollout", n)[0] if results["tokens_per_rollout"][1] else 0 for n in names]
    b.bar([n.removeprefix("completion_") for n in names], [v or 0 for v in values], color="#3a7")
    b.set(title="generated tokens per rollout", ylabel="tokens")
    c.bar([str(x) for x in column("calls_per_rollout", "calls")], column("calls_per_rollout", "rollouts"))
    c.set(title="calls per rollout", xlabel="calls", ylabel="rollouts")
    apis = column("gateway_latency", "api")
    for i, q in enumerate(("p50_ms", "p90_ms", "p99_ms")):
        d.bar([x + i * 0.25 for x in range(len(apis))], column("gateway_latency", q), width=0.25, label=q)
    d.set_xticks(range(len(apis)), apis)
    d.set(title="gateway latency", ylabel="ms")
    d.legend()
    e.bar([str(x) for x in column("staleness", "staleness")], column("staleness", "task_groups"), color="#c73")
    e.set(title="staleness of task groups", xlabel="versions behind", ylabel="task groups")
    f.bar(column("failures_by_status", "status"), column("failures_by_status", "rollouts"), color="#777")
    f.set(title="rollouts by status", ylabel="rollouts")
    fig.suptitle(f"Tether run {run_id}")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
