"""The Faust processors on the real broker: join and grouping, replay equality, dead letters, analytics on chdb,
and a processor killed mid-stream."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from infra.processes import stop
from schemas import topics
from schemas.consumer import EventConsumer
from schemas.events import DeadLetter, Event, ModelCall, RolloutFinished, RolloutStarted, TaskGroup
from schemas.producer import EventProducer
from schemas.samples import read_groups, unique_groups
from schemas.serde import encode
from schemas.settings import BusSettings
from stream_processors.grouping import Policy
from stream_processors.pipeline import content_hash, rebuild
from tests.factories import synthetic_run


@contextmanager
def processor(bus: BusSettings, folder: Path, run_id: str, app_id: str,
              **env: str) -> Iterator[subprocess.Popen[bytes]]:
    """`tether processors run` as its own process; SIGTERM at the end (the test may SIGKILL it first)."""
    log = (folder / f"{app_id}.log").open("ab")
    process = subprocess.Popen(
        [sys.executable, "-m", "tether.cli", "processors", "run", "--run", run_id], stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "TETHER_BUS_BOOTSTRAP_SERVERS": bus.bootstrap_servers, "TETHER_PROCESSOR_APP_ID": app_id,
             "TETHER_PROCESSOR_DATA_DIR": str(folder / app_id), "TETHER_PROCESSOR_CLICKHOUSE_DSN":
             f"chdb://{folder / 'clickhouse'}", "TETHER_PROCESSOR_CHECK_INTERVAL_S": "0.5", **env})
    try:
        yield process
    finally:
        stop(process, grace_s=60)


async def wait_for_groups(bus: BusSettings, run_id: str, n: int, timeout_s: float = 180) -> list[TaskGroup]:
    deadline = time.monotonic() + timeout_s
    while True:
        groups = await unique_groups(bus, run_id)
        if len(groups) >= n or time.monotonic() > deadline:
            return groups
        await asyncio.sleep(1.0)


def disorder(events: list[Event], seed: int, duplicates: int) -> list[Event]:
    """Rollouts interleaved, each rollout's events reordered (across topics), some events sent twice."""
    rng = random.Random(seed)
    mixed = [*events, *rng.sample(events, duplicates)]
    rng.shuffle(mixed)
    return mixed


@dataclass
class Processed:
    run_id: str
    events: list[Event]
    groups: list[TaskGroup]
    garbage: dict[bytes, str]
    folder: Path
    app_id: str


@pytest.fixture(scope="module")
def processed(bus: BusSettings, tmp_path_factory: pytest.TempPathFactory) -> Processed:
    """A run with out-of-order and duplicated events, bad records among them, and a group that never completes."""
    folder = tmp_path_factory.mktemp("processor")
    run_id, app_id = f"run-{uuid.uuid4().hex[:8]}", f"proc-{uuid.uuid4().hex[:6]}"
    events = synthetic_run(run_id, groups=8, group_size=3, seed=11, failing=0.15, compacting=0.3, deltas=True)
    stuck = next(e for e in events if isinstance(e, RolloutFinished) and e.rollout_id.endswith("task7.r2.a0"))
    events = [e for e in events if e is not stuck]  # group 7 waits forever for this rollout: partial after timeout
    garbage = {b"\x00 not avro " + run_id.encode(): "NotSingleObject",
               encode(RolloutStarted(rollout_id="x", run_id=run_id, group_id="g", task_id="t", task_json="{}",
                                     group_size=1)): "WrongTopic"}

    async def publish() -> list[TaskGroup]:
        raw = AIOKafkaProducer(bootstrap_servers=bus.bootstrap_servers)
        await raw.start()
        try:
            for value in garbage:
                await raw.send_and_wait(topics.CALLS.name, value, key=run_id.encode())
        finally:
            await raw.stop()
        async with EventProducer(bus) as producer:
            await producer.publish_many(disorder(events, seed=1, duplicates=40))
        with processor(bus, folder, run_id, app_id, TETHER_PROCESSOR_GROUP_TIMEOUT_S="3"):
            return await wait_for_groups(bus, run_id, 8)

    groups = asyncio.run(publish())
    return Processed(run_id, events, groups, garbage, folder, app_id)


def test_every_group_is_joined_and_grouped(processed: Processed) -> None:
    by_id = {g.group_id: g for g in processed.groups}
    assert len(by_id) == 8
    stuck = by_id[f"{processed.run_id}.task7"]
    assert stuck.partial and len(stuck.rollouts) + len(stuck.dropped) == 2
    for gid, group in by_id.items():
        if gid != stuck.group_id:
            assert not group.partial and len(group.rollouts) + len(group.dropped) == 3
    calls = [e for e in processed.events if isinstance(e, ModelCall)]
    trained = sum(m for g in processed.groups for r in g.rollouts for s in r.segments for m in s.loss_mask)
    kept = {r.rollout_id for g in processed.groups for r in g.rollouts}
    assert trained == sum(len(c.response_token_ids) for c in calls if c.rollout_id in kept)


def test_the_live_groups_equal_a_rebuild_and_a_replay(processed: Processed, bus: BusSettings) -> None:
    expected = content_hash(rebuild(processed.events, processed.run_id, Policy()))
    assert content_hash(processed.groups) == expected
    out = processed.folder / "replay.jsonl"
    replay = subprocess.run(
        [sys.executable, "-m", "tether.cli", "replay", "--run", processed.run_id, "--out", str(out)],
        capture_output=True, text=True, timeout=120, env={**os.environ, "TETHER_BUS_BOOTSTRAP_SERVERS":
                                                          bus.bootstrap_servers})
    assert replay.returncode == 0, replay.stderr
    assert f"rebuilt   sha256 {expected}" in replay.stdout and "identical" in replay.stdout, replay.stdout
    assert len(out.read_text().splitlines()) == 8


def test_bad_records_go_to_the_dead_letters(processed: Processed, bus: BusSettings) -> None:
    async def letters() -> dict[bytes, DeadLetter]:
        found: dict[bytes, DeadLetter] = {}
        async with EventProducer(bus) as dlq, EventConsumer(bus, [topics.DEADLETTER], dlq) as consumer:
            async with asyncio.timeout(60):
                async for received in consumer:
                    letter = received.event
                    if isinstance(letter, DeadLetter) and letter.consumer == f"{processed.app_id}.join" \
                            and letter.value in processed.garbage:
                        found[letter.value] = letter
                        if len(found) == len(processed.garbage):
                            return found
        return found

    found = asyncio.run(letters())
    assert {v: letter.error_type for v, letter in found.items()} == processed.garbage


def test_analytics_on_chdb(processed: Processed) -> None:
    out = processed.folder / "plots"
    result = subprocess.run(
        [sys.executable, "-m", "tether.cli", "analytics", "--run", processed.run_id, "--dsn",
         f"chdb://{processed.folder / 'clickhouse'}", "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    calls = [e for e in processed.events if isinstance(e, ModelCall)]
    rollouts = {e.rollout_id for e in processed.events if isinstance(e, RolloutStarted)}
    text = " ".join(result.stdout.split())
    assert f"│ openai.chat │ {len(calls)} │" in text, text
    finished = [e for e in processed.events if isinstance(e, RolloutFinished)]
    for status in ("succeeded", "failed"):
        assert f"│ {status} │ {sum(e.status == status for e in finished)} │" in text, text
    assert len(rollouts) == 24 and (out / f"{processed.run_id}.png").stat().st_size > 10_000


def test_a_processor_killed_mid_stream_loses_and_doubles_nothing(bus: BusSettings, tmp_path: Path) -> None:
    run_id, app_id = f"run-{uuid.uuid4().hex[:8]}", f"proc-{uuid.uuid4().hex[:6]}"
    events = synthetic_run(run_id, groups=40, group_size=4, seed=7, calls=(2, 4), deltas=True)
    half = len(events) // 2

    async def scenario() -> tuple[list[tuple[TaskGroup, bool]], int]:
        async with EventProducer(bus) as producer:
            await producer.publish_many(events[:half])
            with processor(bus, tmp_path, run_id, app_id) as first:
                await wait_for_groups(bus, run_id, 3)
                first.send_signal(signal.SIGKILL)  # mid-stream: the rest is still being processed or unsent
                first.wait()
            before = len(await unique_groups(bus, run_id))
            await producer.publish_many(events[half:])
            with processor(bus, tmp_path, run_id, app_id):
                await wait_for_groups(bus, run_id, 40)
        return [g async for g in read_groups(bus, run_id)], before

    seen, before = asyncio.run(scenario())
    assert 3 <= before < 40  # the kill came mid-stream
    unique = [g for g, repeated in seen if not repeated]
    assert sorted(g.group_id for g in unique) == sorted(f"{run_id}.task{i}" for i in range(40))
    first_copy = {g.group_id: encode(g) for g in unique}
    assert all(encode(g) == first_copy[g.group_id] for g, repeated in seen if repeated)  # copies are identical
    assert content_hash(unique) == content_hash(rebuild(events, run_id, Policy()))


def test_a_restarted_processor_loses_none_of_the_records_waiting_for_it(bus: BusSettings, tmp_path: Path) -> None:
    """Records on the source topics when a processor starts are all processed: Faust's recovery lost some (half
    the runs of this test before stream_processors.recovery). A first group shows the first processor is
    consuming; the others lack only their RolloutFinished, published while no processor runs. Their calls were
    read by the first processor, which keeps them in memory only: the second reads them back from tether.calls."""
    run_id, app_id = f"run-{uuid.uuid4().hex[:8]}", f"proc-{uuid.uuid4().hex[:6]}"
    events = synthetic_run(run_id, groups=4, group_size=2, seed=5, calls=(3, 5), deltas=True)
    held = [e for e in events if isinstance(e, RolloutFinished) and not e.rollout_id.startswith(f"{run_id}.task0.")]

    async def scenario() -> list[TaskGroup]:
        async with EventProducer(bus) as producer:
            await producer.publish_many([e for e in events if e not in held])
            with processor(bus, tmp_path, run_id, app_id):
                assert len(await wait_for_groups(bus, run_id, 1)) == 1
                await asyncio.sleep(6)  # past Faust's commit interval: every record read is committed
            await producer.publish_many(held)
            with processor(bus, tmp_path, run_id, app_id):
                return await wait_for_groups(bus, run_id, 4, timeout_s=90)

    groups = asyncio.run(scenario())
    assert content_hash(groups) == content_hash(rebuild(events, run_id, Policy()))
    log = (tmp_path / f"{app_id}.log").read_text()
    assert "sealed calls are not on tether.calls" not in log
    assert log.count("calls read back from tether.calls") == 6  # the six rollouts that finished after the restart
