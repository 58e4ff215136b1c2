"""infra/k8s: the committed manifests are a fresh render of the project's tables (one source of truth): a drifted
file is named and fails the check, the KafkaTopics are the topic catalogue and the KafkaUsers the ACL table.
The rest of the checks are in the other tests/test_k8s_*.py (shared helpers: tests/k8s_support.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.k8s import render
from infra.kafka import acls
from schemas.settings import min_insync_replicas
from schemas.topics import CATALOGUE
from tests.k8s_support import K8S, OPT, committed


def test_the_committed_manifests_are_a_fresh_render() -> None:
    assert render.stale(K8S) == [], "run `python -m infra.k8s.render` (or `tether k8s render`) and commit"
    generated = set(render.render())
    by_hand = {"job-template.yaml", "strimzi/pom.xml"}
    on_disk = {str(p.relative_to(K8S)) for p in K8S.rglob("*") if p.is_file() and p.suffix in (".yaml", ".xml")}
    assert on_disk == generated | by_hand, "a manifest nothing renders"


def test_a_drifted_file_is_named_and_the_check_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    render.write(tmp_path)
    assert render.main(["--out", str(tmp_path), "--check"]) == 0
    users = tmp_path / "strimzi" / "users.yaml"
    users.write_text(users.read_text().replace("- Describe", "- DescribeConfigs", 1))
    assert render.stale(tmp_path) == ["strimzi/users.yaml"]
    assert render.main(["--out", str(tmp_path), "--check"]) == 1
    assert "users.yaml: differs from a fresh render" in capsys.readouterr().err


def test_topics_are_the_catalogue() -> None:
    topics = {d["metadata"]["name"]: d["spec"] for d in committed()["strimzi/topics.yaml"]}
    assert list(topics) == [t.name for t in CATALOGUE]
    for topic in CATALOGUE:
        spec = topics[topic.name]
        assert spec["partitions"] == topic.partitions
        assert spec["replicas"] == OPT.replication_factor == 3
        config = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in spec["config"].items()}
        assert config == {**topic.config, "min.insync.replicas": str(min_insync_replicas(3))} \
            and config["min.insync.replicas"] == "2"


def test_users_are_the_acl_table() -> None:
    users = {d["metadata"]["name"]: d["spec"] for d in committed()["strimzi/users.yaml"]}
    assert set(users) == set(acls.BY_NAME) and acls.ADMIN not in users
    for name, spec in users.items():
        assert spec["authentication"] == {"type": "scram-sha-512"}
        assert spec["authorization"]["type"] == "simple"
        granted = {(a["resource"]["type"], a["resource"]["name"], a["resource"]["patternType"],
                    tuple(a["operations"])) for a in spec["authorization"]["acls"]}
        assert all(a["type"] == "allow" for a in spec["authorization"]["acls"])
        assert granted == {(a.resource, a.name, a.pattern, a.operations) for a in acls.BY_NAME[name].acls}
    gateway = {a["resource"]["name"]: a["operations"] for a in users["gateway"]["authorization"]["acls"]}
    assert "tether.samples" not in gateway  # the table's own example: the gateway cannot write samples
