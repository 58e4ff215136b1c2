"""The one `tether` command: help lists the services; bad arguments name the field; status names the stack's run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from infra.processes import write_pid_file
from tether.cli import app
from tether.stack import Stack, StackError, StackSettings

runner = CliRunner()


def test_help_lists_the_services() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for service in ("kafka", "engine", "gateway", "controller", "processors", "trainer", "topics", "events", "model"):
        assert service in result.output


def test_kafka_help_lists_the_lifecycle() -> None:
    result = runner.invoke(app, ["kafka", "--help"])
    for command in ("up", "down", "status", "fetch", "wipe"):
        assert command in result.output


def test_topics_list_shows_the_catalogue() -> None:
    result = runner.invoke(app, ["topics", "list"])
    assert result.exit_code == 0
    for name in ("tether.calls", "tether.rollouts", "tether.samples", "tether.control", "tether.deadletter"):
        assert name in result.output


def test_tail_of_an_unknown_topic_names_it() -> None:
    result = runner.invoke(app, ["events", "tail", "tether.nope"])
    assert result.exit_code == 2
    assert "tether.nope" in result.output


def test_status_names_the_run_whose_stack_was_started_or_says_there_is_none(tmp_path: Path) -> None:
    """Whatever the asking shell's environment says: no TETHER_STACK_RUN_ID here (before, the title said "demo")."""
    env = {"TETHER_STACK_HOME": str(tmp_path), "COLUMNS": "300"}
    result = runner.invoke(app, ["status"], env=env)
    assert result.exit_code == 0 and f"no stack started under {tmp_path}" in result.output, result.output
    assert "demo" not in result.output

    started = Stack(StackSettings(run_id="my-run", home=tmp_path, gateway_replicas=2))
    started.pids.mkdir(parents=True)
    started._record()  # what `tether up` writes before it starts anything
    result = runner.invoke(app, ["status"], env=env)
    assert result.exit_code == 0 and "stack of run my-run" in result.output, result.output
    assert "gateway-2" in result.output and "gateway-lb" in result.output  # its parts, as it was started


def test_up_refuses_while_another_run_s_stack_runs_under_the_same_home(tmp_path: Path) -> None:
    running = Stack(StackSettings(run_id="first", home=tmp_path))
    running.pids.mkdir(parents=True)
    running._record()
    write_pid_file(running.pids / "engine.pid", os.getpid())  # a part of it runs (this very process)
    with pytest.raises(StackError, match="the stack of run 'first' runs under"):
        Stack(StackSettings(run_id="second", home=tmp_path)).up()
    result = runner.invoke(app, ["status"], env={"TETHER_STACK_HOME": str(tmp_path), "COLUMNS": "300"})
    assert "stack of run first" in result.output and str(os.getpid()) in result.output, result.output


@pytest.mark.parametrize("command", [["analytics", "--run", "r"], ["view"]])
def test_a_clickhouse_that_refuses_is_one_line_not_a_traceback(command: list[str]) -> None:
    """Analytics' own errors reach the user as one line with exit code 1, from `tether analytics` and `tether view`
    alike (port 9 on the loopback: nothing listens)."""
    result = runner.invoke(app, [*command, "--dsn", "http://127.0.0.1:9/tether"])
    assert result.exit_code == 1, result.output
    assert result.output.startswith("tether: ") and "127.0.0.1:9" in result.output, result.output
    assert "Traceback" not in result.output
