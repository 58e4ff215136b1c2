"""The engine as a client sees it: the official openai SDK, raw HTTP for vLLM's fields, errors, versions."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import openai
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from tests.conftest import RunningEngine


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(tiny_model)


def client(engine: RunningEngine) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{engine.url}/v1", api_key="unused", max_retries=0)


def complete(engine: RunningEngine, **body: object) -> httpx.Response:
    return httpx.post(f"{engine.url}/v1/completions", json={"model": engine.model, **body}, timeout=120)


def test_models_and_health(engine_server: RunningEngine) -> None:
    models = client(engine_server).models.list()
    assert [m.id for m in models.data] == [engine_server.model]
    health = httpx.get(f"{engine_server.url}/health").json()
    assert health["status"] == "ok" and isinstance(health["weight_version"], int) and health["deterministic"] is False
    complete(engine_server, prompt="What is 2 + 2?", max_tokens=16, temperature=1.0, ignore_eos=True)
    after = httpx.get(f"{engine_server.url}/health").json()
    assert after["busy_s"] > health["busy_s"] >= 0  # generating is counted as the device's busy time


def test_sync_sdk_text_equals_decoded_token_ids(engine_server: RunningEngine,
                                               tokenizer: PreTrainedTokenizerBase) -> None:
    out = client(engine_server).completions.create(
        model=engine_server.model, prompt="What is 2 + 2?", max_tokens=24, temperature=1.0, seed=7, logprobs=3,
        extra_body={"return_token_ids": True},
    )
    choice = out.choices[0]
    extra = choice.model_extra or {}
    assert extra["prompt_token_ids"] == tokenizer("What is 2 + 2?", add_special_tokens=False)["input_ids"]
    ids = extra["token_ids"]
    assert 1 <= len(ids) <= 24
    assert tokenizer.decode(ids, skip_special_tokens=True) == choice.text
    assert choice.finish_reason in ("stop", "length")
    assert out.usage is not None and out.usage.completion_tokens == len(ids)
    assert choice.logprobs is not None and choice.logprobs.token_logprobs is not None
    assert len(choice.logprobs.token_logprobs) == len(ids)
    assert choice.logprobs.top_logprobs is not None and all(len(t) <= 3 for t in choice.logprobs.top_logprobs)
    assert isinstance((out.model_extra or {})["weight_version"], int)


async def test_async_sdk_serves_concurrent_requests(engine_server: RunningEngine) -> None:
    aclient = openai.AsyncOpenAI(base_url=f"{engine_server.url}/v1", api_key="unused", max_retries=0)
    outs = await asyncio.gather(*[
        aclient.completions.create(model=engine_server.model, prompt=f"task {i}:", max_tokens=12, seed=i)
        for i in range(8)
    ])
    assert all(o.choices[0].finish_reason in ("stop", "length") for o in outs)
    assert all(o.usage is not None and 1 <= o.usage.completion_tokens <= 12 for o in outs)


def test_streaming_matches_the_whole_response(engine_server: RunningEngine,
                                             tokenizer: PreTrainedTokenizerBase) -> None:
    whole = complete(engine_server, return_token_ids=True, prompt="def add(a, b):", max_tokens=20, seed=3,
                     temperature=0.8).json()["choices"][0]
    stream = client(engine_server).completions.create(
        model=engine_server.model, prompt="def add(a, b):", max_tokens=20, seed=3, temperature=0.8, stream=True,
        stream_options={"include_usage": True}, extra_body={"return_token_ids": True},
    )
    text, ids, usage, finish = "", [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            text += c.text
            ids += (c.model_extra or {})["token_ids"]
            finish = c.finish_reason or finish
    assert ids == whole["token_ids"]
    assert text == whole["text"] == tokenizer.decode(ids, skip_special_tokens=True)
    assert finish == whole["finish_reason"]
    assert usage is not None and usage.completion_tokens == len(ids)


def test_raw_stream_is_vllm_sse(engine_server: RunningEngine) -> None:
    with httpx.stream("POST", f"{engine_server.url}/v1/completions", timeout=60, json={
        "model": engine_server.model, "prompt": [5, 6, 7], "max_tokens": 4, "stream": True,
        "return_token_ids": True, "ignore_eos": True,
    }) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["prompt_token_ids"] == [5, 6, 7]
    assert all("prompt_token_ids" not in c["choices"][0] for c in chunks[1:])
    assert sum(len(c["choices"][0]["token_ids"]) for c in chunks) == 4
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert {c["object"] for c in chunks} == {"text_completion"}


def test_seeded_sampling_is_reproducible(engine_server: RunningEngine) -> None:
    def ids(seed: int) -> list[int]:
        body = complete(engine_server, prompt="Pick one of A, B, C, D.", max_tokens=16, seed=seed,
                        return_token_ids=True, ignore_eos=True).json()
        return list(body["choices"][0]["token_ids"])

    assert ids(11) == ids(11)
    assert ids(11) != ids(12)


def test_tokens_named_by_id_carry_the_ids_without_the_prompts(engine_server: RunningEngine) -> None:
    """vLLM's `return_tokens_as_token_ids`: each sampled token, and each top alternative, named "token_id:N";
    the answer holds no prompt ids (what the gateway asks for, so a long prompt does not travel back)."""
    ask = {"prompt": [5, 6, 7], "max_tokens": 8, "seed": 3, "ignore_eos": True, "logprobs": 2}
    with_ids = complete(engine_server, **ask, return_token_ids=True).json()["choices"][0]
    named = complete(engine_server, **ask, return_tokens_as_token_ids=True).json()
    choice = named["choices"][0]
    assert "prompt_token_ids" not in choice and "token_ids" not in choice
    assert choice["logprobs"]["tokens"] == [f"token_id:{t}" for t in with_ids["token_ids"]]
    assert all(name.startswith("token_id:") and name[9:].isdigit()
               for top in choice["logprobs"]["top_logprobs"] for name in top)
    assert [len(top) for top in choice["logprobs"]["top_logprobs"]] == [
        len(top) for top in with_ids["logprobs"]["top_logprobs"]]
    assert choice["logprobs"]["token_logprobs"] == with_ids["logprobs"]["token_logprobs"]
    assert choice["text"] == with_ids["text"]


def test_n_choices_and_stop_strings(engine_server: RunningEngine, tokenizer: PreTrainedTokenizerBase) -> None:
    body = complete(engine_server, prompt="hello", n=3, max_tokens=8, seed=1, return_token_ids=True).json()
    assert sorted(c["index"] for c in body["choices"]) == [0, 1, 2]
    assert body["usage"]["completion_tokens"] == sum(len(c["token_ids"]) for c in body["choices"])

    free = complete(engine_server, prompt="hello", max_tokens=30, seed=5, return_token_ids=True,
                    ignore_eos=True).json()["choices"][0]
    stop = free["text"][6:9]
    assert len(stop) == 3
    cut = complete(engine_server, prompt="hello", max_tokens=30, seed=5, return_token_ids=True, ignore_eos=True,
                   stop=[stop]).json()["choices"][0]
    assert cut["finish_reason"] == "stop" and cut["stop_reason"] == stop
    assert stop not in cut["text"] and free["text"].startswith(cut["text"])
    assert str(tokenizer.decode(cut["token_ids"], skip_special_tokens=True)).startswith(cut["text"] + stop)


def test_logprobs_are_those_of_the_sampling_distribution(engine_server: RunningEngine, tiny_model: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    for temperature in (1.0, 0.7):
        body = complete(engine_server, prompt=[3, 17, 42, 99], max_tokens=40, temperature=temperature, seed=9,
                        logprobs=0, return_token_ids=True, ignore_eos=True).json()
        choice = body["choices"][0]
        prompt, ids = choice["prompt_token_ids"], choice["token_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1:-1]
        recomputed = torch.log_softmax(logits / temperature, dim=-1).gather(-1, torch.tensor(ids)[:, None])[:, 0]
        served = torch.tensor(choice["logprobs"]["token_logprobs"])
        assert torch.allclose(served, recomputed, atol=1e-4), (served - recomputed).abs().max()


@pytest.mark.parametrize(("body", "status", "param"), [
    ({"model": "no-such-model", "prompt": "x"}, 404, "model"),
    ({"prompt": "x", "max_tokens": -1}, 400, "max_tokens"),
    ({"prompt": "x", "max_tokens": 5000}, 400, "max_tokens"),
    ({"prompt": [1] * 4096}, 400, "max_tokens"),
    ({"prompt": [1, 2, 10**6]}, 400, "prompt"),
    ({"prompt": [1, -2]}, 400, "prompt"),
    ({"prompt": ["a", "b"]}, 400, "prompt"),
    ({"prompt": "x", "temperature": -1}, 400, "temperature"),
    ({"prompt": "x", "top_p": 0}, 400, "top_p"),
    ({"prompt": "x", "logprobs": 50}, 400, "logprobs"),
])
def test_bad_input_gets_an_openai_error_and_the_engine_stays_up(
    engine_server: RunningEngine, body: dict[str, object], status: int, param: str
) -> None:
    response = httpx.post(f"{engine_server.url}/v1/completions", json={"model": engine_server.model, **body})
    assert response.status_code == status
    error = response.json()["error"]
    assert error["code"] == status and error["param"] == param and error["message"]
    assert complete(engine_server, prompt="still up?", max_tokens=2).status_code == 200


def test_malformed_json_is_a_400(engine_server: RunningEngine) -> None:
    response = httpx.post(f"{engine_server.url}/v1/completions", content=b"{not json",
                          headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert "JSON" in response.json()["error"]["message"]


def test_sdk_raises_on_errors(engine_server: RunningEngine) -> None:
    with pytest.raises(openai.NotFoundError):
        client(engine_server).completions.create(model="nope", prompt="x")
    with pytest.raises(openai.BadRequestError):
        client(engine_server).completions.create(model=engine_server.model, prompt="x", max_tokens=10**6)


async def test_a_long_request_does_not_hold_a_short_one(engine_server: RunningEngine) -> None:
    async with httpx.AsyncClient(base_url=engine_server.url, timeout=120) as http:
        finished: list[str] = []

        async def run(name: str, max_tokens: int) -> None:
            r = await http.post("/v1/completions", json={"model": engine_server.model, "prompt": name,
                                                         "max_tokens": max_tokens, "ignore_eos": True})
            assert r.status_code == 200
            finished.append(name)

        long = asyncio.create_task(run("long", 1500))
        await asyncio.sleep(0.3)
        await run("short", 4)
        assert finished == ["short"]  # the long one is still decoding
        await long
    assert finished == ["short", "long"]


async def test_weight_versions_never_mix_within_a_request(engine_server: RunningEngine) -> None:
    async with httpx.AsyncClient(base_url=engine_server.url, timeout=120) as http:
        start = (await http.get("/v1/weights")).json()["version"]
        versions: list[int] = []
        first_chunk = asyncio.Event()

        async def stream() -> None:
            async with http.stream("POST", "/v1/completions", json={
                "model": engine_server.model, "prompt": "go", "max_tokens": 300, "stream": True, "ignore_eos": True,
            }) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: {"):
                        versions.append(json.loads(line[6:])["weight_version"])
                        first_chunk.set()

        streaming = asyncio.create_task(stream())
        await first_chunk.wait()
        bumped = await http.post("/v1/weights/version", json={"version": start + 1})
        await streaming
        # The version moved only once the running request had finished, on the old version throughout.
        assert bumped.json()["version"] == start + 1
        assert set(versions) == {start} and len(versions) == 300
        after = await http.post("/v1/completions", json={"model": engine_server.model, "prompt": "x",
                                                         "max_tokens": 2})
        assert after.json()["weight_version"] == start + 1
        assert after.headers["x-tether-weight-version"] == str(start + 1)


def test_loading_a_checkpoint_changes_weights_and_version(engine_server: RunningEngine, tiny_model: Path,
                                                          tmp_path: Path) -> None:
    def greedy() -> tuple[list[int], int]:
        body = complete(engine_server, prompt=[10, 20, 30], max_tokens=12, temperature=0, return_token_ids=True,
                        ignore_eos=True).json()
        return body["choices"][0]["token_ids"], body["weight_version"]

    before, version = greedy()
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5, alpha=1.0)
    model.save_pretrained(tmp_path / "perturbed")

    loaded = httpx.post(f"{engine_server.url}/v1/weights/load",
                        json={"path": str(tmp_path / "perturbed"), "version": version + 1}, timeout=60)
    assert loaded.json() == {"version": version + 1}
    changed, v1 = greedy()
    assert v1 == version + 1 and changed != before

    httpx.post(f"{engine_server.url}/v1/weights/load", json={"path": str(tiny_model), "version": version + 2},
               timeout=60)
    restored, v2 = greedy()
    assert (restored, v2) == (before, version + 2)

    missing = httpx.post(f"{engine_server.url}/v1/weights/load", json={"path": str(tmp_path), "version": 9})
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "path"


@pytest.mark.parametrize(("stop", "start"), [("/sleep?level=1", "/wake_up?tags=weights&tags=kv_cache"),
                                             ("/pause?mode=wait", "/resume")])
async def test_calls_wait_while_the_engine_sleeps_or_is_paused(engine_server: RunningEngine, stop: str,
                                                               start: str) -> None:
    """vLLM's routes for the trainer's hand-over: a call made meanwhile waits (it is not refused) and is served
    once the engine wakes or resumes."""
    async with httpx.AsyncClient(base_url=engine_server.url, timeout=120) as http:
        try:
            assert (await http.post(stop)).is_success
            state = (await http.get("/is_sleeping")).json()["is_sleeping"], (await http.get("/is_paused")).json()
            assert state == (stop.startswith("/sleep"), {"is_paused": True})
            call = asyncio.create_task(http.post("/v1/completions", json={
                "model": engine_server.model, "prompt": "2 + 2", "max_tokens": 4}))
            await asyncio.sleep(1.0)
            assert not call.done()
        finally:
            assert (await http.post(start)).is_success
        assert (await asyncio.wait_for(call, 60)).status_code == 200
        assert (await http.get("/is_paused")).json() == {"is_paused": False}
        assert (await http.post("/sleep?level=3")).status_code == 400  # in vLLM's range, 400 as it answers
