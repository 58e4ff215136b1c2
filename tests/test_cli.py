"""The one `tether` command: help lists the services; bad arguments name the field."""

from __future__ import annotations

from typer.testing import CliRunner

from tether.cli import app

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
