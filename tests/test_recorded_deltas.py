"""The same episodes recorded both ways, through real gateways: as deltas (the default) and whole
(TETHER_GATEWAY_EXTENDABLE_CALLS=0). The live processors and a replay of the topics give the same task groups,
hash for hash, from far fewer bytes."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from schemas.events import ModelCall, RolloutFinished, RolloutStarted, TaskGroup
from schemas.producer import EventProducer
from schemas.serde import encode
from schemas.settings import BusSettings
from stream_processors.grouping import Policy
from stream_processors.pipeline import canonical
from stream_processors.replay import read_run_events, replay
from tests.conftest import RunningEngine, RunningGateway, gateway
from tests.factories import T0
from tests.test_processors import processor, wait_for_groups

GROUPS, K, CALLS = 2, 2, 6


async def episodes(gw: RunningGateway, bus: BusSettings) -> None:
    """K rollouts per task, each an agent loop of CALLS calls whose conversation grows by the answer and a user
    turn, announced, sealed and finished as the controller does."""
    async with EventProducer(bus) as producer, httpx.AsyncClient(timeout=60) as client:
        for g in range(GROUPS):
            for k in range(K):
                rid = f"{gw.run_id}.g{g}.r{k}"
                token = gw.register(rid)
                await producer.publish(RolloutStarted(rollout_id=rid, run_id=gw.run_id, group_id=f"{gw.run_id}.g{g}",
                                                      task_id=f"t{g}", task_json="{}", group_size=K))
                messages: list[dict[str, Any]] = [{"role": "system", "content": "You fix bugs. " * 40},
                                                  {"role": "user", "content": f"Task {g}: the test fails."}]
                for step in range(CALLS):
                    r = await client.post(f"{gw.url}/v1/chat/completions", headers={"authorization": f"Bearer {token}"},
                                          json={"model": "m", "messages": messages, "max_tokens": 32})
                    r.raise_for_status()
                    messages += [r.json()["choices"][0]["message"],
                                 {"role": "user", "content": f"step {step} of rollout {k}: the output was {step * k}"}]
                (await client.post(f"{gw.url}/admin/rollouts/{rid}/seal", headers=gw.admin())).raise_for_status()
                await producer.publish(RolloutFinished(rollout_id=rid, run_id=gw.run_id, status="succeeded",
                                                       duration_s=1.0, reward=float(k), finished_at=T0))


def named_alike(groups: list[TaskGroup], run_id: str) -> list[str]:
    """The groups' canonical JSON with the run's own name taken out: two runs of the same episodes compare."""
    return sorted(canonical(g).replace(run_id, "RUN") for g in groups)


@pytest.fixture(scope="module")
def recorded_both_ways(bus: BusSettings, fake_vllm: RunningEngine, tiny_model: Path,
                       tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    tmp_path = tmp_path_factory.mktemp("both-ways")
    runs = {}
    for way, env in (("deltas", {}), ("whole", {"TETHER_GATEWAY_EXTENDABLE_CALLS": "0"})):
        run_id = f"{way}-{uuid.uuid4().hex[:8]}"
        with gateway(bus, fake_vllm, tiny_model, tmp_path / f"{way}.log", run_id, **env) as gw:
            asyncio.run(episodes(gw, bus))
        runs[way] = run_id
    return runs


def test_both_ways_give_the_same_groups_live_and_in_replay(recorded_both_ways: dict[str, str], bus: BusSettings,
                                                           tmp_path: Path) -> None:
    live, replayed, sizes, extended = {}, {}, {}, {}
    for way, run_id in recorded_both_ways.items():
        with processor(bus, tmp_path, run_id, f"proc-{run_id}"):
            live[way] = named_alike(asyncio.run(wait_for_groups(bus, run_id, GROUPS)), run_id)
        events, rebuilt = asyncio.run(replay(bus, run_id, Policy()))
        replayed[way] = named_alike(rebuilt, run_id)
        calls = [e for e in events if isinstance(e, ModelCall)]
        sizes[way] = sum(len(encode(c)) for c in calls)
        extended[way] = sum(c.extends is not None for c in calls)
    assert len(live["deltas"]) == GROUPS
    assert live["deltas"] == live["whole"] == replayed["deltas"] == replayed["whole"]
    assert extended == {"deltas": GROUPS * K * (CALLS - 1), "whole": 0}  # every call but the first extends one
    assert sizes["deltas"] * 2 < sizes["whole"], sizes


def test_a_replay_rebuilds_whole_calls_from_deltas(recorded_both_ways: dict[str, str], bus: BusSettings) -> None:
    from schemas.calls import whole

    def in_order(calls: list[ModelCall], run_id: str) -> list[tuple[str, int, list[int], str]]:
        return sorted((c.rollout_id.removeprefix(run_id), c.seq, c.prompt_token_ids, c.request_json) for c in calls)

    by_way = {way: [e for e in asyncio.run(read_run_events(bus, run_id)) if isinstance(e, ModelCall)]
              for way, run_id in recorded_both_ways.items()}
    assert in_order(whole(by_way["deltas"]), recorded_both_ways["deltas"]) == \
        in_order(by_way["whole"], recorded_both_ways["whole"])
