"""Kafka as a production cluster runs it: three KRaft brokers started by the project's launcher, SASL_SSL with the
cluster's own CA, a SCRAM user per service, ACLs from infra/kafka/acls.py; each refusal one clear line, fast;
acks=all holding with one broker killed; the processors (Faust) working through it as their own user."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import yaml
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from pydantic import SecretStr, ValidationError

from infra.kafka.acls import BY_NAME, PROCESSOR_PREFIX, SERVICES, USERS
from infra.kafka.launcher import KafkaBroker
from infra.kafka.settings import BrokerSettings
from infra.kafka.tls import Certificates
from infra.processes import free_port_block, stop
from schemas import topics
from schemas.admin import admin_client
from schemas.consumer import EventConsumer
from schemas.errors import AuthenticationFailed, NotAuthorized, UntrustedBroker
from schemas.events import Event, ModelCall, RolloutFinished, RolloutSealed, RolloutStarted, TaskGroup
from schemas.producer import EventProducer
from schemas.samples import unique_groups
from schemas.settings import BusSettings
from stream_processors.settings import ProcessorSettings
from tests.conftest import RunningEngine, gateway
from tests.factories import examples, synthetic_run

NODES = 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    base = free_port_block()
    settings = BrokerSettings(state_dir=tmp_path_factory.mktemp("cluster"), brokers=NODES, security="sasl_ssl",
                              port=base, controller_port=base + 1, internal_port=base + 2, heap="320m",
                              start_timeout_s=240)
    kafka = KafkaBroker(settings)
    try:
        kafka.start()
        yield kafka
    finally:
        kafka.stop(force=True)


def service(cluster: KafkaBroker, user: str, **overrides: object) -> BusSettings:
    return cluster.client_settings(user, request_timeout_ms=10_000, delivery_timeout_s=60, **overrides)


def example(kind: type[Event], run_id: str) -> Event:
    return next(e for e in examples(run_id=run_id, rollout_id=f"r-{uuid.uuid4().hex[:8]}") if isinstance(e, kind))


# -- the ACL table, as data ---------------------------------------------------------------------------------------


def test_each_service_has_only_its_own_topics_and_no_harness_user() -> None:
    assert set(USERS) == {"admin", "gateway", "controller", "processors", "trainer"}
    gateway, trainer = BY_NAME["gateway"], BY_NAME["trainer"]
    assert gateway.may("Write", topics.CALLS.name) and not gateway.may("Write", topics.SAMPLES.name)
    assert not gateway.may("Read", topics.SAMPLES.name) and not trainer.may("Read", topics.CALLS.name)
    assert trainer.may("Read", topics.SAMPLES.name) and trainer.may("Write", topics.CONTROL.name)
    for user in SERVICES:  # every reader reports the records it rejects
        assert user.may("Write", topics.DEADLETTER.name), user.name
    assert ProcessorSettings().app_id.startswith(PROCESSOR_PREFIX)


def test_sasl_without_a_password_names_the_setting() -> None:
    with pytest.raises(ValidationError) as raised:
        BusSettings(security_protocol="SASL_SSL", username="gateway")
    assert raised.value.errors()[0]["loc"] == ("password",)


# -- the secured three-broker cluster ----------------------------------------------------------------------------


def test_the_cluster_runs_three_brokers_and_status_finds_them_all(cluster: KafkaBroker) -> None:
    again = KafkaBroker(BrokerSettings(state_dir=cluster.state_dir))  # a later `tether kafka status`, no settings
    status = again.status()
    assert (status.running, status.ready, status.security) == (True, True, "sasl_ssl")
    assert len(status.pids) == NODES and all(status.pids.values())
    assert status.bootstrap == cluster.bootstrap


async def test_the_catalogue_has_three_replicas_and_min_insync_two(cluster: KafkaBroker) -> None:
    names = [t.name for t in topics.CATALOGUE]
    async with admin_client(cluster.client_settings()) as admin:
        described = await admin.describe_topics(names)
        configs = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, name, {"min.insync.replicas": None}) for name in names])
    assert {d["topic"] for d in described} == set(names)
    for topic in described:
        assert {len(p["replicas"]) for p in topic["partitions"]} == {3}, topic["topic"]
    found = {r[3]: {c[0]: c[1] for c in r[4]} for response in configs for r in response.resources}
    assert {name: found[name]["min.insync.replicas"] for name in names} == dict.fromkeys(names, "2")


async def test_a_service_writes_and_another_reads_as_its_own_user(cluster: KafkaBroker, run_id: str) -> None:
    call = example(ModelCall, run_id)
    async with EventProducer(service(cluster, "gateway"), client_id="gateway-gw-test") as gateway:
        delivery = await gateway.publish(call)
    processors = service(cluster, "processors")
    async with EventProducer(processors) as deadletters, \
            EventConsumer(processors, [topics.CALLS], deadletters, name="processors-test") as consumer:
        read = [r.event async for r in consumer.read_to_end() if r.offset == delivery.offset
                and r.partition == delivery.partition]
    assert read == [call]


async def test_a_wrong_password_is_one_clear_line_at_once(cluster: KafkaBroker) -> None:
    wrong = service(cluster, "gateway", password=SecretStr("not-the-password"))
    started = time.monotonic()
    with pytest.raises(AuthenticationFailed) as raised:
        await EventProducer(wrong, client_id="gateway-gw-1").start()
    assert time.monotonic() - started < 15
    server = cluster.bootstrap.split(",")[0]
    assert str(raised.value) == (f"gateway-gw-1 as User:gateway could not log in to Kafka at {server} with "
                                 "SCRAM-SHA-512: wrong username or password")


async def test_a_harness_has_no_user(cluster: KafkaBroker) -> None:
    harness = service(cluster, "gateway", username="harness")
    with pytest.raises(AuthenticationFailed, match="as User:harness could not log in"):
        await EventProducer(harness, client_id="harness").start()


async def test_a_broker_signed_by_another_ca_is_not_trusted(cluster: KafkaBroker, tmp_path: Path) -> None:
    other = Certificates(tmp_path / "other-ca")
    other.ensure(range(0), ())
    untrusting = service(cluster, "trainer", ca_file=other.ca_cert)
    started = time.monotonic()
    with pytest.raises(UntrustedBroker) as raised:
        async with EventConsumer(untrusting, [topics.SAMPLES], EventProducer(untrusting), name="trainer-run-1"):
            pass
    assert time.monotonic() - started < 15
    message, server = str(raised.value), cluster.bootstrap.split(",")[0]
    assert message.startswith(f"trainer-run-1 as User:trainer does not trust Kafka at {server}: ")
    assert "unable to get local issuer certificate" in message and str(other.ca_cert) in message


async def test_a_missing_acl_names_the_service_the_principal_and_the_topic(cluster: KafkaBroker,
                                                                          run_id: str) -> None:
    async with EventProducer(service(cluster, "gateway"), client_id="gateway-gw-1") as gateway:
        with pytest.raises(NotAuthorized) as raised:
            await gateway.publish(example(TaskGroup, run_id))
    assert str(raised.value) == ("gateway-gw-1 as User:gateway may not write to topic tether.samples: Kafka's ACLs "
                                 "do not allow it")
    trainer = service(cluster, "trainer")
    with pytest.raises(NotAuthorized, match=r"^trainer-x as User:trainer may not read topic tether\.calls: "):
        async with EventConsumer(trainer, [topics.CALLS], EventProducer(trainer), name="trainer-x"):
            pass


def test_the_cli_prints_a_refusal_as_one_line(cluster: KafkaBroker) -> None:
    env = {f"TETHER_BUS_{k}": v for k, v in {
        "BOOTSTRAP_SERVERS": cluster.bootstrap, "SECURITY_PROTOCOL": "SASL_SSL", "USERNAME": "gateway",
        "PASSWORD": cluster.users.password("gateway"), "CA_FILE": str(cluster.certs.ca_cert)}.items()}
    done = subprocess.run([sys.executable, "-m", "tether.cli", "events", "tail", topics.SAMPLES.name, "--max", "1"],
                          capture_output=True, text=True, timeout=60, env={**os.environ, **env})
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "tether: tether as User:gateway may not read topic tether.samples: Kafka's ACLs do not allow it"]


# -- services through the secured cluster, each as its own user ---------------------------------------------------


def test_the_gateway_records_calls_as_its_own_user(cluster: KafkaBroker, fake_vllm: RunningEngine, tiny_model: Path,
                                                   tmp_path: Path) -> None:
    """The gateway's producer, its control-topic follower and its peer watch on tether.calls, all as User:gateway."""
    with gateway(cluster.client_settings("gateway"), fake_vllm, tiny_model, tmp_path / "gateway.log",
                 **cluster.client_env("gateway")) as gw:
        rollout_id = f"r-{uuid.uuid4().hex[:10]}"
        token = gw.register(rollout_id)
        answer = httpx.post(f"{gw.url}/v1/chat/completions", headers={"authorization": f"Bearer {token}"},
                            json={"model": "any", "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 8},
                            timeout=60)
        assert answer.status_code == 200, answer.text
        sealed = httpx.post(f"{gw.url}/admin/rollouts/{rollout_id}/seal", headers=gw.admin(), timeout=60)
        assert sealed.json()["n_calls"] == 1

    async def recorded() -> list[Event]:
        processors = service(cluster, "processors")
        async with EventProducer(processors) as deadletters, \
                EventConsumer(processors, [topics.CALLS], deadletters, name="processors-test") as consumer:
            return [r.event async for r in consumer.read_to_end() if getattr(r.event, "rollout_id", "") == rollout_id]

    call, seal = asyncio.run(recorded())
    assert isinstance(call, ModelCall) and isinstance(seal, RolloutSealed) and seal.call_ids == [call.call_id]


# -- Faust through the secured cluster ---------------------------------------------------------------------------


@contextmanager
def processors_as_their_user(cluster: KafkaBroker, folder: Path, run_id: str) -> Iterator[subprocess.Popen[bytes]]:
    """`tether processors run` with exactly what `tether kafka env processors` prints."""
    env = dict(line.removeprefix("export ").split("=", 1) for line in subprocess.run(
        [sys.executable, "-m", "tether.cli", "kafka", "env", "processors"], capture_output=True, text=True,
        check=True, env={**os.environ, "TETHER_KAFKA_STATE_DIR": str(cluster.state_dir)}).stdout.splitlines())
    with (folder / "processors.log").open("ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "tether.cli", "processors", "run", "--run", run_id], stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env, "TETHER_PROCESSOR_APP_ID": f"{PROCESSOR_PREFIX}-{run_id}",
                 "TETHER_PROCESSOR_DATA_DIR": str(folder / "state"), "TETHER_PROCESSOR_CLICKHOUSE_DSN": "",
                 "TETHER_PROCESSOR_CHECK_INTERVAL_S": "0.5"})
    try:
        yield process
    finally:
        stop(process, grace_s=60)


async def test_the_processors_join_and_group_through_the_secured_cluster(cluster: KafkaBroker, run_id: str,
                                                                         tmp_path: Path) -> None:
    events = synthetic_run(run_id, groups=2, group_size=2, seed=3)
    async with EventProducer(service(cluster, "controller")) as controller, \
            EventProducer(service(cluster, "gateway")) as gateway:
        for event in events:  # each event as the service that writes it
            await (controller if isinstance(event, RolloutStarted | RolloutFinished) else gateway).publish(event)
    trainer = service(cluster, "trainer")
    with processors_as_their_user(cluster, tmp_path, run_id) as process:
        deadline = time.monotonic() + 150
        groups: list[TaskGroup] = []
        while len(groups) < 2 and time.monotonic() < deadline and process.poll() is None:
            await asyncio.sleep(1)
            groups = await unique_groups(trainer, run_id)
    log = (tmp_path / "processors.log").read_text()
    assert len(groups) == 2, log[-2000:]
    assert {g.group_id for g in groups} == {f"{run_id}.task0", f"{run_id}.task1"}


# -- a broker killed ---------------------------------------------------------------------------------------------


def test_the_stack_trains_through_the_secured_cluster_each_service_as_its_own_user(
        cluster: KafkaBroker, tiny_model: Path, tmp_path: Path) -> None:
    """`tether up` on the secured cluster: engine, two gateway replicas, processors and trainer as their own users;
    the controller as its own; one update trained and published, and a replay (as admin) equal to it."""
    from controller.config import load_config
    from controller.main import run
    from controller.settings import ControllerSettings
    from infra.processes import free_port
    from stream_processors.grouping import Policy
    from stream_processors.pipeline import content_hash
    from stream_processors.replay import replay
    from tether.stack import Stack, StackSettings
    from trainer import checkpoint

    run_id = f"secured-{uuid.uuid4().hex[:6]}"
    settings = StackSettings(run_id=run_id, home=tmp_path / "home", model=tiny_model, engine_port=free_port(),
                             gateway_port=free_port_block(3), gateway_replicas=2,
                             trainer={"batch_groups": 2, "max_updates": 1, "zero_variance": "keep"})
    stack = Stack(settings, broker=cluster)
    try:
        stack.up()
        agent = Path(__file__).parent.parent / "examples" / "openai_agent.py"
        tasks = [{"id": f"q{i}", "question": f"What is {i}?", "answer": str(i)} for i in range(2)]
        (tmp_path / "tasks.jsonl").write_text("".join(f"{json.dumps(t)}\n" for t in tasks))
        (tmp_path / "run.yaml").write_text(yaml.safe_dump({
            "run_id": run_id, "dataset": "tasks.jsonl", "group_size": 2, "concurrency": 4, "timeout_s": 120,
            "harness": {"command": [sys.executable, str(agent), "--max-turns", "2", "--max-tokens", "8"],
                        "setup": ["mkdir", "-p", "work/{rollout_id}"], "workdir": "."},
            "sandbox": {"workdir": "work/{rollout_id}", "read_only": [str(agent)]}}))
        controller = ControllerSettings(gateway_url=settings.gateway_url, gateway_admin_key=settings.admin_key,
                                        gateway_secret=settings.secret, bus=service(cluster, "controller"))
        view = asyncio.run(run(load_config(tmp_path / "run.yaml"), controller))
        assert len(view.rollouts) == 4 and all(s.finished for s in view.rollouts.values())
        deadline, latest = time.monotonic() + 180, None
        while time.monotonic() < deadline and (latest is None or checkpoint.load_state(latest).version < 1):
            time.sleep(0.5)
            latest = checkpoint.latest(settings.run_dir / "checkpoints" / run_id)
        assert latest is not None and checkpoint.load_state(latest).version == 1, stack.logs
        admin = service(cluster, "admin")
        stored = asyncio.run(unique_groups(admin, run_id))
        _, rebuilt = asyncio.run(replay(admin, run_id, Policy()))
        assert len(stored) == 2 and content_hash(rebuilt) == content_hash(stored)
    finally:
        stack.down(keep_kafka=True)


async def test_acks_all_holds_with_one_broker_killed_and_it_rejoins(cluster: KafkaBroker, run_id: str) -> None:
    admin_bus = cluster.client_settings()
    async with admin_client(admin_bus) as admin:
        (calls,) = await admin.describe_topics([topics.CALLS.name])
    victim = calls["partitions"][0]["leader"]
    assert cluster.stop(force=True, node=victim)  # SIGKILL: no controlled shutdown, no leadership handed over
    assert sum(pid is not None for pid in cluster.pids().values()) == NODES - 1
    batch = [example(ModelCall, run_id) for _ in range(16)]
    async with EventProducer(service(cluster, "gateway"), client_id="gateway-gw-1") as gateway:
        deliveries = await gateway.publish_many(batch)  # acks=all: every in-sync replica, at least 2
    assert len({d.partition for d in deliveries}) > 1
    async with admin_client(admin_bus) as admin:
        (calls,) = await admin.describe_topics([topics.CALLS.name])
    for partition in calls["partitions"]:
        assert partition["leader"] != victim and len(partition["isr"]) == 2 and victim not in partition["isr"]
    await asyncio.to_thread(cluster.start)  # the killed node again, on its intact disk
    assert cluster.status().ready
