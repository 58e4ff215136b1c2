"""infra/k8s's command: `tether k8s render` (tether/cli/k8s.py) writes the same files as the module, --check fails
on a drifted one, and its options (a namespace, a run id, replicas) move everything; bad ones are refused."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from infra.k8s import render
from tether.cli.k8s import k8s_app


def test_the_command_renders_checks_and_takes_options(tmp_path: Path) -> None:
    """`tether k8s render` (tether/cli/k8s.py): the same files; --check fails on a drifted one; a namespace moves
    everything, HAProxy's server names included."""
    runner = CliRunner()
    same = tmp_path / "same"
    assert runner.invoke(k8s_app, ["render", "--out", str(same)]).exit_code == 0
    assert render.stale(same) == [] and runner.invoke(k8s_app, ["render", "--out", str(same), "--check"]).exit_code == 0
    (same / "gateway.yaml").write_text("# edited\n")
    checked = runner.invoke(k8s_app, ["render", "--out", str(same), "--check"])
    assert checked.exit_code == 1 and "gateway.yaml" in checked.output
    other = tmp_path / "other"
    assert runner.invoke(k8s_app, ["render", "--out", str(other), "--namespace", "agents", "--run-id", "r7",
                                   "--gateway-replicas", "3"]).exit_code == 0
    text = {p.name: p.read_text() for p in other.rglob("*.yaml")}
    assert "namespace: tether" not in "".join(text.values())
    assert "tether-gateway-replica-0.tether-gateway-replicas.agents.svc.cluster.local:8000" in text["gateway-lb.yaml"]
    assert "run_id: r7" in (other / "run" / "input.yaml").read_text()
    refused = runner.invoke(k8s_app, ["render", "--out", str(other), "--processor-replicas", "9"])
    assert refused.exit_code == 2 and "partitions of tether.calls" in refused.output
    refused = runner.invoke(k8s_app, ["render", "--out", str(other), "--gateway-replicas", "9"])
    assert refused.exit_code == 2 and "gateway slots must be at least the gateway replicas" in refused.output
    assert render.main(["--out", str(other), "--gateway-replicas", "9"]) == 2
