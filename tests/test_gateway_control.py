"""Weight updates, failures and bad input at the gateway: held not rejected, clear errors, nothing lost."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from infra.kafka.launcher import KafkaBroker
from infra.processes import free_port
from schemas import topics
from schemas.admin import ensure_topics
from schemas.consumer import EventConsumer
from schemas.events import (
    GatewayDrained,
    GatewayJoined,
    ModelCall,
    RewardReported,
    UpdateRequested,
    WeightVersionPublished,
    run_of,
)
from schemas.producer import EventProducer
from schemas.settings import BusSettings
from tests.conftest import RunningEngine, RunningGateway, gateway
from tests.test_gateway_openai import new_rollout, recorded

ASK = {"model": "m", "messages": [{"role": "user", "content": "x?"}], "max_tokens": 4}


async def control_events(bus: BusSettings, run_id: str, kind: type, wanted: int = 1) -> list[object]:
    found: list[object] = []
    async with EventProducer(bus) as p, EventConsumer(bus, [topics.CONTROL], p) as consumer:
        async with asyncio.timeout(30):
            async for batch in consumer.batches(timeout_ms=200):
                found += [r.event for r in batch
                          if isinstance(r.event, kind) and run_of(r.event) == run_id]
                if len(found) >= wanted:
                    return found
    raise AssertionError("unreachable")


async def test_update_holds_calls_drains_and_resumes(scripted_gateway: RunningGateway, bus: BusSettings) -> None:
    gw = scripted_gateway
    joined, *beats = await control_events(bus, gw.run_id, GatewayJoined)  # then one a heartbeat (10 s)
    assert all(b.gateway_id == joined.gateway_id for b in beats)  # type: ignore[attr-defined]
    rollout_id, token = new_rollout(gw)
    version = 7
    async with EventProducer(bus) as producer, httpx.AsyncClient(base_url=gw.url, timeout=60) as http:
        await producer.publish(UpdateRequested(run_id=gw.run_id, version=version, n_task_groups=1))
        drained = await control_events(bus, gw.run_id, GatewayDrained)
        assert drained[0].gateway_id == joined.gateway_id and drained[0].version == version  # type: ignore[attr-defined]
        try:
            held = asyncio.create_task(http.post("/v1/chat/completions", json=ASK,
                                                 headers={"authorization": f"Bearer {token}"}))
            for _ in range(100):
                state = (await http.get("/admin/state", headers=gw.admin())).json()
                if state["held"] == 1:
                    break
                await asyncio.sleep(0.05)
            assert state["paused"] and state["paused_for"] == version and state["held"] == 1
            assert not held.done()  # queued, not rejected
        finally:
            await producer.publish(WeightVersionPublished(run_id=gw.run_id, version=version))
        response = await held
    assert response.status_code == 200
    (call,) = [c for c in await recorded(bus, rollout_id, 1) if isinstance(c, ModelCall)]
    assert call.weight_version == version and call.timings.queued_ms > 0


def test_kafka_down_is_a_503_and_the_gateway_recovers(own_broker: KafkaBroker, fake_vllm: RunningEngine,
                                                      tiny_model: Path, tmp_path: Path) -> None:
    bus = BusSettings(bootstrap_servers=own_broker.bootstrap)
    asyncio.run(ensure_topics(bus))
    with gateway(bus, fake_vllm, tiny_model, tmp_path / "gw.log", run_id="kafka-down") as gw:
        rollout_id, token = new_rollout(gw)
        client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=token, max_retries=0)
        assert client.chat.completions.create(**ASK).choices  # type: ignore[call-overload]
        own_broker.stop(force=True)
        with pytest.raises(openai.InternalServerError) as raised:
            client.chat.completions.create(**ASK)  # type: ignore[call-overload]
        assert raised.value.status_code == 503 and "could not be recorded" in raised.value.message
        assert raised.value.response.headers.get("retry-after")
        own_broker.start()
        assert client.chat.completions.create(**ASK).choices  # type: ignore[call-overload]
        sealed = httpx.post(f"{gw.url}/admin/rollouts/{rollout_id}/seal", headers=gw.admin(), timeout=60).json()
        assert sealed["n_calls"] == 2  # the refused call is not part of the rollout


def test_engine_down_is_a_502_recorded_as_an_error(bus: BusSettings, tiny_model: Path, tmp_path: Path) -> None:
    dead = RunningEngine(f"http://127.0.0.1:{free_port()}", "gone", None)  # type: ignore[arg-type]
    with gateway(bus, dead, tiny_model, tmp_path / "gw.log", run_id="engine-down",
                 TETHER_GATEWAY_MODEL_NAME="tiny", TETHER_GATEWAY_ENGINE_RETRIES="1") as gw:
        rollout_id, token = new_rollout(gw)
        client = anthropic.Anthropic(base_url=gw.url, api_key=token, max_retries=0)
        with pytest.raises(anthropic.APIStatusError) as raised:
            client.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": "x"}])
        assert raised.value.status_code == 502
        assert raised.value.body["error"]["type"] == "api_error"  # type: ignore[index]
        (call,) = [c for c in asyncio.run(recorded(bus, rollout_id, 1)) if isinstance(c, ModelCall)]
        assert call.status == "error" and call.http_status == 502 and call.error
        assert httpx.get(f"{gw.url}/health").status_code == 200


def test_a_call_held_too_long_gets_a_503_with_retry_after(bus: BusSettings, fake_vllm: RunningEngine,
                                                          tiny_model: Path, tmp_path: Path) -> None:
    with gateway(bus, fake_vllm, tiny_model, tmp_path / "gw.log", run_id=f"hold-{uuid.uuid4().hex[:6]}",
                 TETHER_GATEWAY_MAX_HOLD_S="0.5") as gw:
        _, token = new_rollout(gw)
        assert httpx.post(f"{gw.url}/admin/pause", json={"version": 1}, headers=gw.admin()).status_code == 200
        r = httpx.post(f"{gw.url}/v1/chat/completions", json=ASK, headers={"authorization": f"Bearer {token}"})
        assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]["type"] == "service_unavailable"
        httpx.post(f"{gw.url}/admin/resume", headers=gw.admin())
        r = httpx.post(f"{gw.url}/v1/chat/completions", json=ASK, headers={"authorization": f"Bearer {token}"})
        assert r.status_code == 200


@pytest.mark.parametrize(("body", "status", "needle"), [
    (b"{not json", 400, "malformed JSON"),
    (json.dumps({**ASK, "messages": 5}).encode(), 400, "messages"),
    (json.dumps({**ASK, "temperature": "hot"}).encode(), 400, "temperature"),
    (json.dumps({**ASK, "frobnicate": 1}).encode(), 400, "frobnicate"),
    (json.dumps({**ASK, "messages": []}).encode(), 400, "messages"),
    (json.dumps({**ASK, "max_tokens": 10**9}).encode(), 400, "context"),
    (b"[1, 2]", 400, "JSON object"),
])
def test_bad_input_is_a_clear_openai_error(scripted_gateway: RunningGateway, gateway_server: RunningGateway,
                                           body: bytes, status: int, needle: str) -> None:
    gw = gateway_server if needle == "context" else scripted_gateway  # only the real engine knows its context
    _, token = new_rollout(gw)
    r = httpx.post(f"{gw.url}/v1/chat/completions", content=body,
                   headers={"authorization": f"Bearer {token}", "content-type": "application/json"})
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert needle in error["message"] and error["type"] == "invalid_request_error"


def test_huge_bodies_and_anthropic_errors(scripted_gateway: RunningGateway) -> None:
    _, token = new_rollout(scripted_gateway)
    huge = b'{"model": "m", "messages": [{"role": "user", "content": "' + b"x" * (17 * 1024 * 1024) + b'"}]}'
    r = httpx.post(f"{scripted_gateway.url}/v1/chat/completions", content=huge,
                   headers={"authorization": f"Bearer {token}", "content-type": "application/json"}, timeout=60)
    assert r.status_code == 413
    r = httpx.post(f"{scripted_gateway.url}/v1/messages", json={"model": "m", "messages": []},
                   headers={"x-api-key": token})
    assert r.status_code == 400
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(f"{scripted_gateway.url}/v1/messages", json={"model": "m", "max_tokens": 5,
                                                                "messages": [{"role": "user", "content": "x"}]},
                   headers={"x-api-key": "wrong"})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"


def test_rewards_are_recorded_for_the_token_holder_only(scripted_gateway: RunningGateway, bus: BusSettings) -> None:
    gw = scripted_gateway
    rollout_id, token = new_rollout(gw)
    _, other = new_rollout(gw)
    url = f"{gw.url}/rollouts/{rollout_id}/reward"
    assert httpx.post(url, json={"reward": 1.0}, headers={"authorization": f"Bearer {other}"}).status_code == 403
    assert httpx.post(url, json={"reward": "high"}, headers={"authorization": f"Bearer {token}"}).status_code == 400
    ok = httpx.post(url, json={"reward": 0.75, "details": {"tests": 3}}, headers={"authorization": f"Bearer {token}"})
    assert ok.status_code == 200

    async def find() -> RewardReported:
        async with EventProducer(bus) as p, EventConsumer(bus, [topics.ROLLOUTS], p) as consumer:
            async with asyncio.timeout(30):
                async for received in consumer:
                    if isinstance(received.event, RewardReported) and received.event.rollout_id == rollout_id:
                        return received.event
        raise AssertionError("unreachable")

    reward = asyncio.run(find())
    assert reward.reward == 0.75 and json.loads(reward.details_json or "{}") == {"tests": 3}


def test_a_call_is_named_to_the_harness_and_rewarded_on_its_own(scripted_gateway: RunningGateway,
                                                                 bus: BusSettings) -> None:
    gw = scripted_gateway
    rollout_id, token = new_rollout(gw)
    auth = {"authorization": f"Bearer {token}"}
    answer = httpx.post(f"{gw.url}/v1/chat/completions", headers=auth, json={
        "model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "x?"}]})
    streamed = httpx.post(f"{gw.url}/v1/chat/completions", headers=auth, json={
        "model": "m", "max_tokens": 8, "stream": True, "messages": [{"role": "user", "content": "x?"}]})
    first, second = answer.headers["x-tether-call-id"], streamed.headers["x-tether-call-id"]
    url = f"{gw.url}/rollouts/{rollout_id}/reward"
    unknown = httpx.post(url, headers=auth, json={"reward": 1.0, "call_id": "call-not-mine"})
    assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "call_id"
    assert httpx.post(url, headers=auth, json={"call_id": first}).status_code == 400  # no reward
    assert httpx.post(url, headers=auth, json={"reward": 0.5, "call_id": first}).status_code == 200
    assert httpx.post(url, headers=auth, json={"steps": [{"call_id": second, "reward": -1.0}]}).status_code == 200

    async def find() -> list[RewardReported]:
        found: list[RewardReported] = []
        async with EventProducer(bus) as p, EventConsumer(bus, [topics.ROLLOUTS], p) as consumer:
            async with asyncio.timeout(30):
                async for received in consumer:
                    if isinstance(received.event, RewardReported) and received.event.rollout_id == rollout_id:
                        found.append(received.event)
                        if len(found) == 2:
                            return found
        raise AssertionError("unreachable")

    assert [(r.call_id, r.reward) for r in asyncio.run(find())] == [(first, 0.5), (second, -1.0)]


def test_metrics_are_exposed(scripted_gateway: RunningGateway) -> None:
    text = httpx.get(f"{scripted_gateway.url}/metrics").text
    for name in ("tether_gateway_requests_total", "tether_gateway_call_seconds_bucket",
                 "tether_gateway_kafka_publish_seconds_count", "tether_gateway_held_calls"):
        assert name in text
