"""The broker launcher: prerequisites named in one line, PID-based lifecycle, readiness by metadata."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from infra.errors import BrokerBusy, PortInUse, PrerequisiteMissing
from infra.kafka import jars
from infra.kafka.config import server_properties
from infra.kafka.launcher import KafkaBroker, new_cluster_id
from infra.kafka.settings import BrokerSettings
from infra.kafka.tls import Certificates
from infra.processes import free_port
from tests.conftest import broker_settings

TETHER = [sys.executable, "-m", "tether.cli"]


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*TETHER, *args], capture_output=True, text=True, env={**os.environ, **(env or {})},
                          timeout=120)


def props_of(settings: BrokerSettings, node: int = 1, certs: Certificates | None = None) -> dict[str, str]:
    text = server_properties(settings, node, settings.state_dir / "data", certs)
    return dict(line.split("=", 1) for line in text.splitlines() if line)


def test_config_is_single_node_kraft_on_loopback(tmp_path: Path) -> None:
    settings = BrokerSettings(state_dir=tmp_path, port=19092, controller_port=19093)
    props = props_of(settings)
    assert props["process.roles"] == "broker,controller"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:19093"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:19092"
    assert props["log.dirs"] == str((tmp_path / "data").resolve())
    assert props["auto.create.topics.enable"] == "false"
    assert (props["default.replication.factor"], props["min.insync.replicas"]) == ("1", "1")


def test_three_nodes_form_one_quorum_with_replication_3_and_min_insync_2(tmp_path: Path) -> None:
    settings = BrokerSettings(state_dir=tmp_path, brokers=3, port=19092, controller_port=19093)
    assert settings.bootstrap == "127.0.0.1:19092,127.0.0.1:19102,127.0.0.1:19112"
    props = props_of(settings, node=2)
    assert props["node.id"] == "2"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:19093,2@127.0.0.1:19103,3@127.0.0.1:19113"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:19102"
    assert (props["default.replication.factor"], props["min.insync.replicas"]) == ("3", "2")
    assert props["offsets.topic.replication.factor"] == "3"
    assert props["unclean.leader.election.enable"] == "false"


def test_secured_nodes_take_clients_on_sasl_ssl_and_each_other_on_mutual_tls(tmp_path: Path) -> None:
    settings = BrokerSettings(state_dir=tmp_path, brokers=3, security="sasl_ssl", port=19092,
                              controller_port=19093, internal_port=19094)
    props = props_of(settings, node=3, certs=Certificates(tmp_path / "tls"))
    assert props["listener.security.protocol.map"] == "CLIENT:SASL_SSL,INTERNAL:SSL,CONTROLLER:SSL"
    assert props["advertised.listeners"] == "CLIENT://127.0.0.1:19112,INTERNAL://127.0.0.1:19114"
    assert props["listener.name.client.sasl.enabled.mechanisms"] == "SCRAM-SHA-512"
    assert props["listener.name.internal.ssl.client.auth"] == props["listener.name.controller.ssl.client.auth"] \
        == "required"
    assert props["allow.everyone.if.no.acl.found"] == "false"
    assert props["super.users"] == "User:admin;User:kafka-node-1;User:kafka-node-2;User:kafka-node-3"
    assert props["ssl.keystore.location"].endswith("tls/kafka-node-3.pem")


def test_missing_java_is_one_clear_line(tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    done = run_cli("kafka", "up", env={"PATH": str(empty), "TETHER_KAFKA_STATE_DIR": str(tmp_path / "k"),
                                       "TETHER_KAFKA_PORT": str(free_port()),
                                       "TETHER_KAFKA_CONTROLLER_PORT": str(free_port())})
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == ["tether: Java 17+ is required to run Kafka, and `java` is not on PATH."]


def test_a_taken_port_is_one_line_from_the_cli(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_cli("kafka", "up", env={"TETHER_KAFKA_STATE_DIR": str(tmp_path), "TETHER_KAFKA_PORT": str(port),
                                           "TETHER_KAFKA_CONTROLLER_PORT": str(free_port()), "COLUMNS": "40"})
    assert done.returncode == 1
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"tether: port {port} on 127.0.0.1 is taken")


def test_a_bad_setting_names_its_variable(tmp_path: Path) -> None:
    done = run_cli("kafka", "status", env={"TETHER_KAFKA_PORT": "abc", "TETHER_KAFKA_STATE_DIR": str(tmp_path)})
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("tether: TETHER_KAFKA_PORT")


def test_missing_maven_is_named_when_jars_must_be_fetched(tmp_path: Path) -> None:
    java_only = tmp_path / "bin"
    java_only.mkdir()
    java = subprocess.run(["which", "java"], capture_output=True, text=True).stdout.strip()
    (java_only / "java").symlink_to(java)
    broker = KafkaBroker(BrokerSettings(cache_dir=tmp_path / "cache", state_dir=tmp_path / "k"))
    old = os.environ["PATH"]
    os.environ["PATH"] = str(java_only)
    try:
        jars.find_java()
        with pytest.raises(PrerequisiteMissing, match="Maven is required"):
            broker.fetch()
    finally:
        os.environ["PATH"] = old


def test_a_taken_port_is_reported(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        broker = KafkaBroker(BrokerSettings(state_dir=tmp_path, port=port, controller_port=free_port()))
        with pytest.raises(PortInUse, match=str(port)):
            broker.start()
    assert broker.pid() is None


def test_start_is_idempotent_and_status_reads_the_pid_file(broker: KafkaBroker) -> None:
    pid = broker.pid()
    assert pid is not None
    assert broker.start() == pid
    again = KafkaBroker(broker.settings)  # a later process finds it through the PID file
    status = again.status()
    assert (status.running, status.ready, status.pid) == (True, True, pid)
    assert status.cluster_id == broker.probe()


def test_running_data_cannot_be_wiped(broker: KafkaBroker) -> None:
    with pytest.raises(BrokerBusy):
        broker.wipe()


def test_lifecycle_through_the_cli(tmp_path: Path) -> None:
    settings = broker_settings(tmp_path / "k")
    env = {"TETHER_KAFKA_STATE_DIR": str(settings.state_dir), "TETHER_KAFKA_PORT": str(settings.port),
           "TETHER_KAFKA_CONTROLLER_PORT": str(settings.controller_port), "TETHER_KAFKA_HEAP": settings.heap,
           "TETHER_BUS_BOOTSTRAP_SERVERS": settings.bootstrap}
    assert run_cli("kafka", "status", env=env).returncode == 3
    up = run_cli("kafka", "up", env=env)
    assert up.returncode == 0, up.stderr
    assert "ready on" in up.stderr
    try:
        assert run_cli("kafka", "status", env=env).returncode == 0
        assert "All topics exist" in run_cli("topics", "create", env=env).stderr  # `up` created the catalogue
    finally:
        down = run_cli("kafka", "down", env=env)
    assert down.returncode == 0 and "stopped" in down.stderr
    assert KafkaBroker(settings).pid() is None
    assert run_cli("kafka", "wipe", env=env).returncode == 0
    assert not (settings.state_dir / "node-1").exists()


def test_cluster_ids_are_kafka_uuids_the_storage_tool_accepts() -> None:
    """One base64 id in 64 starts with '-', which `kafka-storage format -t` reads as an option (a fresh `make run`
    failed so); 2,000 draws would hold some."""
    import base64

    ids = [new_cluster_id() for _ in range(2000)]
    assert not [i for i in ids if i.startswith("-")]
    assert all(len(base64.urlsafe_b64decode(i + "==")) == 16 for i in ids) and len(set(ids)) == 2000


def test_a_restarted_node_waits_until_the_cluster_answers_without_it(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A failed describe (the admin client asked the dead node) is no answer: taking it for "fenced" restarted
    the node while the others still listed it, and its registration was refused."""
    broker = KafkaBroker(BrokerSettings(state_dir=tmp_path, brokers=3))
    answers: list[dict[str, object] | None] = [
        None,
        {"cluster_id": "c", "brokers": [{"node_id": 1}, {"node_id": 2}, {"node_id": 3}]},
        None,
        {"cluster_id": "c", "brokers": [{"node_id": 1}, {"node_id": 3}]},
    ]
    asked = []

    def describe(timeout_s: float) -> dict[str, object] | None:
        asked.append(timeout_s)
        return answers[len(asked) - 1]

    monkeypatch.setattr(broker, "_describe", describe)
    monkeypatch.setattr("infra.kafka.launcher.time.sleep", lambda s: None)
    broker._await_fenced([broker.nodes[1]])
    assert len(asked) == 4  # returned only on the answer that no longer lists node 2
    broker._await_fenced(broker.nodes)  # a whole-cluster start asks nobody
    assert len(asked) == 4
