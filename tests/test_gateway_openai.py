"""Harnesses speaking OpenAI through the gateway: the official SDK, token binding, and the record on Kafka."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st
from transformers import AutoTokenizer

from gateway.chat import Message, ToolCall, unanswered_result
from schemas import topics
from schemas.calls import Wholes
from schemas.consumer import EventConsumer
from schemas.events import ModelCall, RolloutSealed
from schemas.producer import EventProducer
from schemas.rollout_token import mint
from schemas.seeds import call_seed
from schemas.settings import BusSettings
from tests.conftest import SECRET, RunningGateway

LOOKUP: Any = {"type": "function", "function": {"name": "lookup", "description": "Look a word up.",
                                           "parameters": {"type": "object",
                                                          "properties": {"q": {"type": "string"}}}}}


def new_rollout(gw: RunningGateway) -> tuple[str, str]:
    rollout_id = f"r-{uuid.uuid4().hex[:10]}"
    return rollout_id, gw.register(rollout_id)


def sdk(gw: RunningGateway, token: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gw.url}/v1", api_key=token, max_retries=0)


async def recorded(bus: BusSettings, rollout_id: str, wanted: int, whole: bool = True
                   ) -> list[ModelCall | RolloutSealed]:
    """The rollout's first `wanted` calls and seal as tether.calls holds them, calls made whole unless not `whole`."""
    found: list[ModelCall | RolloutSealed] = []
    async with EventProducer(bus) as p, EventConsumer(bus, [topics.CALLS], p) as consumer:
        async with asyncio.timeout(30):
            async for batch in consumer.batches(timeout_ms=200):
                found += [r.event for r in batch if isinstance(r.event, ModelCall | RolloutSealed)
                          and r.event.rollout_id == rollout_id]
                if len(found) >= wanted:
                    wholes = Wholes()
                    return [wholes.add(e) if whole and isinstance(e, ModelCall) else e for e in found]
    raise AssertionError("unreachable")


def test_chat_call_is_answered_and_recorded(gateway_server: RunningGateway, bus: BusSettings,
                                            tiny_model: Path) -> None:
    rollout_id, token = new_rollout(gateway_server)
    client = sdk(gateway_server, token)
    out = client.chat.completions.create(model="any", messages=[{"role": "user", "content": "Say hi."}],
                                         max_tokens=12, temperature=1.0, seed=1)
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].finish_reason in ("stop", "length")
    seal = httpx.post(f"{gateway_server.url}/admin/rollouts/{rollout_id}/seal", headers=gateway_server.admin())
    assert seal.json()["n_calls"] == 1
    events = asyncio.run(recorded(bus, rollout_id, 2))
    call, sealed = events
    assert isinstance(call, ModelCall) and isinstance(sealed, RolloutSealed)
    assert sealed.call_ids == [call.call_id]
    assert call.seq == 0 and call.status == "ok" and call.run_id == gateway_server.run_id
    assert out.usage is not None
    assert json.loads(call.response_json)["choices"][0]["message"]["content"] == out.choices[0].message.content
    assert len(call.response_token_ids) == len(call.response_logprobs) == out.usage.completion_tokens
    assert len(call.prompt_token_ids) == out.usage.prompt_tokens
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    assert tokenizer.decode(call.response_token_ids, skip_special_tokens=True) == out.choices[0].message.content
    assert str(tokenizer.decode(call.prompt_token_ids)).endswith("Say hi.<|im_end|>\n<|im_start|>assistant\n")


def test_a_token_cannot_write_to_another_rollout(gateway_server: RunningGateway) -> None:
    _a, token_a = new_rollout(gateway_server)
    b, _ = new_rollout(gateway_server)
    client = openai.OpenAI(base_url=f"{gateway_server.url}/rollouts/{b}/v1", api_key=token_a, max_retries=0)
    with pytest.raises(openai.PermissionDeniedError):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=2)
    with pytest.raises(openai.AuthenticationError):
        sdk(gateway_server, "not-a-token").chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}], max_tokens=2)


def test_path_binding_needs_the_rollouts_own_token(gateway_server: RunningGateway) -> None:
    rollout_id, token = new_rollout(gateway_server)
    url = f"{gateway_server.url}/rollouts/{rollout_id}/v1/chat/completions"
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    assert httpx.post(url, json=body).status_code == 401
    assert httpx.post(url, json=body, headers={"authorization": "Bearer EMPTY"}).status_code == 401
    assert httpx.post(url, json=body, headers={"authorization": f"Bearer {token}"}).status_code == 200
    # The rollout comes from the path only, never from a query string.
    assert httpx.post(f"{gateway_server.url}/v1/chat/completions", params={"rollout_id": rollout_id},
                      json=body).status_code == 401
    assert httpx.get(f"{gateway_server.url}/admin/state", headers={"authorization": "Bearer nope"}).status_code == 401


def test_unknown_and_sealed_rollouts(gateway_server: RunningGateway) -> None:
    client = openai.OpenAI(base_url=f"{gateway_server.url}/rollouts/nobody/v1", api_key=mint("nobody", SECRET),
                           max_retries=0)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=2)
    rollout_id, token = new_rollout(gateway_server)
    httpx.post(f"{gateway_server.url}/admin/rollouts/{rollout_id}/seal", headers=gateway_server.admin())
    with pytest.raises(openai.ConflictError):
        sdk(gateway_server, token).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}], max_tokens=2)


def test_streaming_with_usage_matches_the_record(gateway_server: RunningGateway, bus: BusSettings) -> None:
    rollout_id, token = new_rollout(gateway_server)
    stream = sdk(gateway_server, token).chat.completions.create(
        model="m", messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Go."}],
        max_tokens=16, seed=3, stream=True, stream_options={"include_usage": True})
    text, finish, usage = "", None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    assert finish in ("stop", "length") and usage is not None
    (call,) = asyncio.run(recorded(bus, rollout_id, 1))
    assert isinstance(call, ModelCall)
    assert json.loads(call.response_json)["choices"][0]["message"]["content"] == text
    assert len(call.response_token_ids) == usage.completion_tokens


async def test_async_sdk_with_n_choices(gateway_server: RunningGateway, bus: BusSettings) -> None:
    rollout_id, token = new_rollout(gateway_server)
    client = openai.AsyncOpenAI(base_url=f"{gateway_server.url}/v1", api_key=token, max_retries=0)
    outs = await asyncio.gather(*[client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": f"q{i}"}], max_tokens=6, n=2, seed=i) for i in range(3)])
    assert all(len(o.choices) == 2 for o in outs)
    calls = await recorded(bus, rollout_id, 6)
    assert sorted((c.seq, c.choice_index) for c in calls if isinstance(c, ModelCall)) == \
        [(s, i) for s in range(3) for i in range(2)]


def test_tool_calls_come_back_and_their_turns_are_reused(gateway_server: RunningGateway, bus: BusSettings,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A tiny random model rarely writes a tool call; seeds are searched until it does (bounded)."""
    rollout_id, token = new_rollout(gateway_server)
    client = sdk(gateway_server, token)
    messages: list[Any] = [{"role": "user", "content": "Look up x."}]
    got_text = client.chat.completions.create(model="m", messages=messages, tools=[LOOKUP],
                                              max_tokens=8, seed=0)
    reply = got_text.choices[0].message
    messages.append(reply.model_dump(exclude_none=True))
    messages.append({"role": "user", "content": "And y?"})
    client.chat.completions.create(model="m", messages=messages, tools=[LOOKUP], max_tokens=8, seed=1)
    first, second = [c for c in asyncio.run(recorded(bus, rollout_id, 2)) if isinstance(c, ModelCall)]
    head = first.prompt_token_ids + first.response_token_ids
    assert second.prompt_token_ids[:len(head)] == head  # the model's own turn came back as its ids
    # and so the second is recorded as what it adds to the first: the tokens after it, the request's new middle
    stored = [c for c in asyncio.run(recorded(bus, rollout_id, 2, whole=False)) if isinstance(c, ModelCall)][1]
    assert stored.extends == first.call_id and stored.prompt_token_ids == second.prompt_token_ids[len(head):]
    assert len(stored.request_json) < len(second.request_json) and stored.request_head > 0


def test_plain_completions(gateway_server: RunningGateway) -> None:
    _rollout_id, token = new_rollout(gateway_server)
    out = sdk(gateway_server, token).completions.create(model="m", prompt="def f(x):", max_tokens=8, logprobs=1)
    assert out.choices[0].finish_reason in ("stop", "length")
    assert out.choices[0].logprobs is not None and out.choices[0].logprobs.token_logprobs


def test_models_list(gateway_server: RunningGateway) -> None:
    _, token = new_rollout(gateway_server)
    assert len(sdk(gateway_server, token).models.list().data) == 1


def test_a_tool_result_for_a_call_the_model_never_made_is_a_400(gateway_server: RunningGateway,
                                                                bus: BusSettings) -> None:
    """A forged tool history, refused as OpenAI refuses it; the same result after the assistant's call is served."""
    rollout_id, token = new_rollout(gateway_server)
    call = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "x"}'}}
    result = {"role": "tool", "tool_call_id": "call_1", "content": "42"}
    user = {"role": "user", "content": "Look up x."}
    for messages in ([user, result], [user, {**result, "tool_call_id": "call_2"}], [user, result,
                     {"role": "assistant", "content": None, "tool_calls": [call]}]):
        with pytest.raises(openai.BadRequestError) as refused:
            sdk(gateway_server, token).chat.completions.create(model="m", messages=messages,  # type: ignore[arg-type]
                                                               tools=[LOOKUP], max_tokens=4)
        error: Any = refused.value.body
        assert error["param"] == "messages.1.tool_call_id" and "answers no tool call" in error["message"], error
    fine = [user, {"role": "assistant", "content": None, "tool_calls": [call]}, result]
    sdk(gateway_server, token).chat.completions.create(model="m", messages=fine, tools=[LOOKUP],  # type: ignore[arg-type]
                                                       max_tokens=4)
    assert [c.seq for c in asyncio.run(recorded(bus, rollout_id, 1)) if isinstance(c, ModelCall)] == [0]


@given(st.lists(st.tuples(st.sampled_from(["user", "assistant", "tool"]), st.sampled_from(["a", "b", "c"])),
                max_size=8))
def test_a_result_is_answered_only_by_a_call_made_before_it(turns: list[tuple[str, str]]) -> None:
    messages = [Message(role, "x", (ToolCall(name, "f", "{}"),) if role == "assistant" else (),
                        name if role == "tool" else None) for role, name in turns]
    found = unanswered_result(messages)
    made_before = [{t[1] for t in turns[:i] if t[0] == "assistant"} for i in range(len(turns))]
    orphans = [i for i, (role, name) in enumerate(turns) if role == "tool" and name not in made_before[i]]
    assert found == ((orphans[0], turns[orphans[0]][1]) if orphans else None)


def test_a_pinned_temperature_is_what_every_call_samples_with(gateway_server: RunningGateway,
                                                              bus: BusSettings) -> None:
    """A validation rollout's token pins greedy sampling: the harness asks for 1.0 and gets the same greedy answer
    every time, recorded at 0.0, in either API it speaks."""
    rollout_id = f"r-{uuid.uuid4().hex[:10]}"
    gateway_server.register(rollout_id)
    token = mint(rollout_id, SECRET, temperature=0.0)
    messages: Any = [{"role": "user", "content": "Say hi."}]
    answers = {sdk(gateway_server, token).chat.completions.create(
        model="any", messages=messages, max_tokens=12, temperature=1.0, seed=seed).choices[0].message.content
        for seed in (1, 2, 3)}
    assert len(answers) == 1  # greedy: the seed makes no difference
    anthropic = httpx.post(f"{gateway_server.url}/v1/messages", headers={"x-api-key": token}, json={
        "model": "any", "max_tokens": 12, "temperature": 1.0, "messages": messages})
    assert anthropic.status_code == 200, anthropic.text
    calls = [e for e in asyncio.run(recorded(bus, rollout_id, 4)) if isinstance(e, ModelCall)]
    assert [c.sampling.temperature for c in calls] == [0.0] * 4
    assert json.loads(calls[0].request_json)["temperature"] == 1.0  # what the harness sent stays on the record


def test_a_seeded_rollout_samples_each_unseeded_call_with_a_seed_drawn_from_its_own(gateway_server: RunningGateway,
                                                                                    bus: BusSettings) -> None:
    """The token's seed gives every call that names none a seed of its own (the rollout's and the call's number),
    recorded with the call, so a rollout of the same seed elsewhere samples the same answers; a harness's own seed
    is kept."""
    answers: dict[str, list[str | None]] = {}
    seeds: dict[str, list[int | None]] = {}
    for name, rollout_seed in (("first", 11), ("again", 11), ("other", 12)):
        rollout_id = f"r-{uuid.uuid4().hex[:10]}"
        gateway_server.register(rollout_id)
        token = mint(rollout_id, SECRET, seed=rollout_seed)
        messages: Any = [{"role": "user", "content": "Say hi."}]
        answers[name] = [sdk(gateway_server, token).chat.completions.create(
            model="any", messages=messages, max_tokens=12, temperature=1.0).choices[0].message.content
            for _ in range(3)]
        anthropic = httpx.post(f"{gateway_server.url}/v1/messages", headers={"x-api-key": token}, json={
            "model": "any", "max_tokens": 12, "temperature": 1.0, "messages": messages})  # no seed in its API
        assert anthropic.status_code == 200, anthropic.text
        sdk(gateway_server, token).chat.completions.create(model="any", messages=messages, max_tokens=4, seed=5)
        calls = sorted((e for e in asyncio.run(recorded(bus, rollout_id, 5)) if isinstance(e, ModelCall)),
                       key=lambda c: c.seq)
        seeds[name] = [c.sampling.seed for c in calls]
        assert seeds[name] == [call_seed(rollout_seed, seq) for seq in range(4)] + [5]
    assert answers["first"] == answers["again"]  # the same seeds, the same samples, in another rollout
    assert len(set(answers["first"])) > 1  # each call its own seed: not one sample repeated
    assert seeds["other"][:4] != seeds["first"][:4]


def test_a_seeded_rollouts_tool_call_and_answer_ids_repeat_in_another_rollout_of_its_seed(
        scripted_gateway: RunningGateway) -> None:
    """A harness sends tool-call ids back with the results (and a Responses client its answers' ids): drawn from
    the call's seed and number, they are the same in a rerun of the rollout (so its next request is too), distinct
    within it, and random without a seed; in every API."""
    ids: dict[str, list[str]] = {}
    for name, seed in (("first", 21), ("again", 21), ("unseeded", None)):
        rollout_id = f"r-{uuid.uuid4().hex[:10]}"
        scripted_gateway.register(rollout_id)
        token = mint(rollout_id, SECRET, seed=seed)
        messages: Any = [{"role": "user", "content": "Look x up."}]
        ids[name] = []
        for _ in range(2):
            answer = sdk(scripted_gateway, token).chat.completions.create(
                model="any", messages=messages, tools=[LOOKUP], max_tokens=64)
            assert answer.choices[0].message.tool_calls, answer
            ids[name] += [answer.id, *(c.id for c in answer.choices[0].message.tool_calls)]
        completion = sdk(scripted_gateway, token).completions.create(model="any", prompt="Hi", max_tokens=4)
        message = httpx.post(f"{scripted_gateway.url}/v1/messages", headers={"x-api-key": token}, json={
            "model": "any", "max_tokens": 12, "messages": messages})
        assert message.status_code == 200, message.text
        ids[name] += [completion.id, message.json()["id"]]
    assert ids["first"] == ids["again"] and len(set(ids["first"])) == len(ids["first"]) == 6
    assert [i.split("_")[0].split("-")[0] for i in ids["first"]] == ["chatcmpl", "call", "chatcmpl", "call", "cmpl",
                                                                    "msg"]
    assert not set(ids["unseeded"]) & set(ids["first"])
