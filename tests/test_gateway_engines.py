"""The engine pool: rollouts pinned to one engine, bounded retries on failures, engine refusals are the caller's."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from hypothesis import given
from hypothesis import strategies as st

from gateway.errors import EngineFailed, InvalidRequest, NoReplicaReady
from gateway.replicas import held_version, routable
from gateway.settings import GatewaySettings
from gateway.upstream import EnginePool
from infra.processes import free_port, stop
from tests.conftest import spawn


def test_a_rollout_always_goes_to_the_same_engine_and_all_engines_are_used() -> None:
    pool = EnginePool(["http://a:1", "http://b:2", "http://c:3"])
    picks = Counter(pool.pick(f"rollout-{i}") for i in range(3000))
    assert set(picks) == {"http://a:1", "http://b:2", "http://c:3"}
    assert min(picks.values()) > 800  # roughly even
    assert all(pool.pick(f"rollout-{i}") == pool.pick(f"rollout-{i}") for i in range(100))


@asynccontextmanager
async def engine_pool(url: str, retries: int) -> AsyncIterator[EnginePool]:
    pool = EnginePool([url], retries=retries, backoff_s=0.01)
    try:
        yield pool
    finally:
        await pool.close()


@pytest.fixture
async def flaky() -> AsyncIterator[tuple[str, list[int]]]:
    """An engine that fails with the scripted statuses before it answers."""
    statuses: list[int] = []

    async def completions(request: web.Request) -> web.Response:
        status = statuses.pop(0) if statuses else 200
        if status != 200:
            return web.json_response({"error": {"message": f"status {status}"}}, status=status)
        return web.json_response({"choices": [{"index": 0, "text": "ok", "token_ids": [1]}]})

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    server = TestServer(app)
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/"), statuses
    finally:
        await server.close()


async def test_an_engine_behind_a_key_gets_it_and_its_refusal_is_not_retried() -> None:
    async def completions(request: web.Request) -> web.Response:
        if request.headers.get("authorization") != "Bearer engine-key":
            return web.json_response({"error": "Unauthorized"}, status=401)  # vLLM's body for a missing key
        return web.json_response({"choices": [{"index": 0, "text": "ok", "token_ids": [1]}]})

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    server = TestServer(app)
    await server.start_server()
    url = str(server.make_url("")).rstrip("/")
    try:
        keyed, bare = EnginePool([url], api_key="engine-key"), EnginePool([url], retries=3, backoff_s=0.01)
        assert (await keyed.complete("r", {}))["choices"][0]["text"] == "ok"
        with pytest.raises(EngineFailed, match=r"401.*engine_api_key"):  # the gateway's fault, not the caller's
            await bare.complete("r", {})
        assert "engine-key" not in repr(GatewaySettings(engine_api_key="engine-key"))
        await keyed.close()
        await bare.close()
    finally:
        await server.close()


async def test_5xx_is_retried_then_answered(flaky: tuple[str, list[int]]) -> None:
    url, statuses = flaky
    statuses += [503, 500]
    async with engine_pool(url, retries=3) as pool:
        assert (await pool.complete("r", {}))["choices"][0]["text"] == "ok"
    assert statuses == []


async def test_retries_are_bounded(flaky: tuple[str, list[int]]) -> None:
    url, statuses = flaky
    statuses += [503] * 10
    async with engine_pool(url, retries=2) as pool:
        with pytest.raises(EngineFailed, match="503"):
            await pool.complete("r", {})
    assert len(statuses) == 7  # three attempts: the first and two retries


async def test_a_refusal_is_the_callers_error_and_not_retried(flaky: tuple[str, list[int]]) -> None:
    url, statuses = flaky
    statuses += [400, 400]
    async with engine_pool(url, retries=3) as pool:
        with pytest.raises(InvalidRequest, match="status 400"):
            await pool.complete("r", {})
    assert statuses == [400]


async def test_an_absent_engine_fails_after_the_retries() -> None:
    async with engine_pool("http://127.0.0.1:1", retries=1) as pool:
        with pytest.raises(EngineFailed, match="2 attempts"):
            await pool.complete("r", {})


def test_settings_come_from_a_yaml_file_below_the_environment(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text("port: 9123\nmax_hold_s: 5\nengines: [http://e1:1, http://e2:2]\n")
    monkeypatch.setenv("TETHER_GATEWAY_CONFIG", str(config))
    monkeypatch.setenv("TETHER_GATEWAY_PORT", "9555")
    settings = GatewaySettings()
    assert (settings.port, settings.max_hold_s, settings.engines) == (9555, 5.0, ["http://e1:1", "http://e2:2"])


async def test_an_engine_writing_infinity_for_a_logprob_is_still_read() -> None:
    """The fast JSON reader refuses -Infinity and NaN, which some servers write for a -inf logprob: the stdlib
    reads them, whole bodies and stream chunks alike."""
    body = '{"choices": [{"index": 0, "text": "ok", "token_ids": [1], "logprobs": [-Infinity]}]}'

    async def completions(request: web.Request) -> web.StreamResponse:
        if not (await request.json()).get("stream"):
            return web.Response(text=body, content_type="application/json")
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        await response.write(f"data: {body}\n\ndata: [DONE]\n\n".encode())
        return response

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    server = TestServer(app)
    await server.start_server()
    try:
        async with engine_pool(str(server.make_url("")).rstrip("/"), retries=0) as pool:
            whole = await pool.complete("r", {"prompt": [1]})
            chunks = [chunk async for chunk in pool.stream("r", {"prompt": [1]})]
    finally:
        await server.close()
    assert whole["choices"][0]["logprobs"] == [float("-inf")]
    assert [c["choices"][0]["logprobs"] for c in chunks] == [[float("-inf")]]


def test_only_the_rollouts_of_a_replica_that_drops_out_move() -> None:
    pool = EnginePool(["http://a:1", "http://b:2", "http://c:3"])
    before = {f"rollout-{i}": pool.pick(f"rollout-{i}") for i in range(600)}
    pool.routable = ["http://a:1", "http://c:3"]
    after = {rollout: pool.pick(rollout) for rollout in before}
    assert all(after[r] == url for r, url in before.items() if url != "http://b:2")
    assert {after[r] for r, url in before.items() if url == "http://b:2"} == {"http://a:1", "http://c:3"}


@given(held=st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), st.none() | st.integers(0, 5), min_size=1),
       current=st.integers(0, 5), answered_before=st.booleans())
def test_calls_go_to_replicas_holding_the_current_version_or_wait_when_one_answered_behind(
        held: dict[str, int | None], current: int, answered_before: bool) -> None:
    ready = routable(held, current, answered_before)
    up_to_date = {url for url, version in held.items() if version is not None and version >= current}
    answered = answered_before or any(version is not None for version in held.values())
    assert ready == (up_to_date if answered else set(held))  # never answered: as without the check
    assert ready <= set(held)


@pytest.mark.parametrize(("kind", "body", "version"), [
    ("tether", {"version": 4, "paused": False}, 4), ("vllm", {"weight_version": "7"}, 7),
    ("vllm", {"weight_version": "default"}, 0), ("sglang", {"weight_version": "default", "model_path": "m"}, 0),
    ("sglang", {"weight_version": "12"}, 12)])
def test_each_engine_says_its_version_in_its_own_words(kind: str, body: dict[str, object], version: int) -> None:
    assert held_version(kind, body) == version


async def test_the_pool_routes_around_a_restarted_replica_until_it_holds_the_current_version(
        tiny_model: Path, tmp_path: Path) -> None:
    """Two vLLM replicas (the fake) at version 3; one restarts (its label back to "default"): the gateway's calls
    all go to the other until the trainer labels it 3 again. With every replica behind, a call waits (up to the
    hold bound, then a 503) until one is brought up."""
    servers = []
    for i in range(2):
        port = free_port()
        servers.append(spawn(["tests.fakes.vllm_rl", "--model", str(tiny_model), "--port", str(port)],
                             tmp_path / f"vllm{i}.log", "FakeVLLM", port))
    urls = [url for url, _ in servers]
    pool = EnginePool(urls)
    watch = asyncio.create_task(pool.watch("vllm", lambda: 3, every_s=0.1))
    try:
        async with httpx.AsyncClient() as http:
            await http.post(f"{urls[0]}/update_weight_version", json={"new_version": "3"})

            async def routed(expected: list[str]) -> None:
                async with asyncio.timeout(10):
                    while pool.routable != expected:  # noqa: ASYNC110  # the pool is polled: no event to wait on
                        await asyncio.sleep(0.05)

            await routed([urls[0]])
            assert {pool.pick(f"rollout-{i}") for i in range(50)} == {urls[0]}
            await http.post(f"{urls[1]}/update_weight_version", json={"new_version": "3"})
            await routed(urls)
            assert {pool.pick(f"rollout-{i}") for i in range(50)} == set(urls)
            stop(servers[0][1])  # silent: routed around as well
            await routed([urls[1]])
            stop(servers[1][1])  # every replica silent, after they had answered: they may come back on launch
            await routed([])     # weights, so calls wait rather than go to them unchecked
            servers[1] = spawn(["tests.fakes.vllm_rl", "--model", str(tiny_model), "--port",
                                urls[1].rsplit(":", 1)[1]], tmp_path / "vllm1-restarted.log", "FakeVLLM",
                               int(urls[1].rsplit(":", 1)[1]))
            await asyncio.sleep(0.5)
            assert pool.routable == []  # back, on its launch weights ("default"): still not routed to
            await http.post(f"{urls[1]}/update_weight_version", json={"new_version": "3"})
            await routed([urls[1]])
            await http.post(f"{urls[1]}/update_weight_version", json={"new_version": "default"})  # restarted too
            await routed([])  # one answered, behind: calls wait for a replica to be brought up
            pool.hold_s = 0.5
            with pytest.raises(NoReplicaReady):
                await pool.choose("rollout-1")
            pool.hold_s = 10
            waiting = asyncio.create_task(pool.choose("rollout-1"))
            await asyncio.sleep(0.3)
            assert not waiting.done()
            await http.post(f"{urls[1]}/update_weight_version", json={"new_version": "3"})  # brought up
            assert await asyncio.wait_for(waiting, 10) == urls[1]
    finally:
        watch.cancel()
        await pool.close()
        for _, process in servers:
            stop(process)
