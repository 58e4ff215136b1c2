"""Agent loops with tool calls through the gateway, with the official openai and anthropic SDKs and litellm.

The model is FakeVLLM scripted as "call lookup, then answer", so every client
sees a real tool call; the record on Kafka is checked for each.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import uuid
from typing import Any

import anthropic
import openai

from schemas.events import ModelCall
from schemas.settings import BusSettings
from tests.conftest import FINAL_REPLY, RunningGateway
from tests.test_gateway_openai import LOOKUP, new_rollout, recorded

ANTHROPIC_LOOKUP: Any = {"name": "lookup", "description": "Look a word up.",
                    "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}}}


def calls_of(bus: BusSettings, rollout_id: str, n: int) -> list[ModelCall]:
    return [c for c in asyncio.run(recorded(bus, rollout_id, n)) if isinstance(c, ModelCall)]


def assert_extends(calls: list[ModelCall]) -> None:
    for before, after in itertools.pairwise(calls):
        head = before.prompt_token_ids + before.response_token_ids
        assert after.prompt_token_ids[:len(head)] == head


def test_openai_tool_loop(scripted_gateway: RunningGateway, bus: BusSettings) -> None:
    rollout_id, token = new_rollout(scripted_gateway)
    client = openai.OpenAI(base_url=f"{scripted_gateway.url}/v1", api_key=token, max_retries=0)
    messages: list[Any] = [{"role": "user", "content": "What is x?"}]
    first = client.chat.completions.create(model="m", messages=messages, tools=[LOOKUP])
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    call: Any = choice.message.tool_calls[0]
    assert call.function.name == "lookup" and json.loads(call.function.arguments) == {"q": "x"}
    messages += [choice.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "x means 42"}]
    second = client.chat.completions.create(model="m", messages=messages, tools=[LOOKUP])
    assert second.choices[0].message.content == FINAL_REPLY and second.choices[0].finish_reason == "stop"
    assert_extends(calls_of(bus, rollout_id, 2))


def test_openai_streamed_tool_call(scripted_gateway: RunningGateway) -> None:
    _, token = new_rollout(scripted_gateway)
    client = openai.OpenAI(base_url=f"{scripted_gateway.url}/v1", api_key=token, max_retries=0)
    stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x?"}],
                                            tools=[LOOKUP], stream=True)
    names, arguments, content, finish = [], "", "", None
    for chunk in stream:
        for c in chunk.choices:
            content += c.delta.content or ""
            for tc in c.delta.tool_calls or []:
                names.append(tc.function.name if tc.function else None)
                arguments += (tc.function.arguments or "") if tc.function else ""
            finish = c.finish_reason or finish
    assert names == ["lookup"] and json.loads(arguments) == {"q": "x"}
    assert "<tool_call>" not in content and finish == "tool_calls"


def test_anthropic_sdk_tool_use_loop(scripted_gateway: RunningGateway, bus: BusSettings) -> None:
    """How Claude-Code-style clients connect: ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY."""
    rollout_id, token = new_rollout(scripted_gateway)
    client = anthropic.Anthropic(base_url=scripted_gateway.url, api_key=token, max_retries=0)
    messages: list[Any] = [{"role": "user", "content": "What is x?"}]
    first = client.messages.create(model="claude-x", max_tokens=64, system="Use tools.", messages=messages,
                                   tools=[ANTHROPIC_LOOKUP])
    assert first.stop_reason == "tool_use"
    (use,) = [b for b in first.content if b.type == "tool_use"]
    assert use.name == "lookup" and use.input == {"q": "x"}
    messages += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                               "content": "x means 42"}]}]
    second = client.messages.create(model="claude-x", max_tokens=64, system="Use tools.", messages=messages,
                                    tools=[ANTHROPIC_LOOKUP])
    assert second.stop_reason == "end_turn"
    assert [b.text for b in second.content if b.type == "text"] == [FINAL_REPLY]
    assert second.usage.output_tokens > 0 and second.usage.input_tokens > 0
    assert_extends(calls_of(bus, rollout_id, 2))


def test_anthropic_sdk_streaming(scripted_gateway: RunningGateway) -> None:
    rollout_id = f"r-{uuid.uuid4().hex[:10]}"
    token = scripted_gateway.register(rollout_id)
    client = anthropic.Anthropic(base_url=f"{scripted_gateway.url}/rollouts/{rollout_id}", api_key=token,
                                 max_retries=0)
    with client.messages.stream(model="claude-x", max_tokens=64, tools=[ANTHROPIC_LOOKUP],
                                messages=[{"role": "user", "content": "x?"}]) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    (use,) = [b for b in final.content if b.type == "tool_use"]
    assert use.input == {"q": "x"}
    with client.messages.stream(model="claude-x", max_tokens=64, messages=[
            {"role": "user", "content": "x?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": use.id, "name": "lookup",
                                               "input": {"q": "x"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "42"}]}]) as s:
        text = "".join(s.text_stream)
    assert text == FINAL_REPLY


def test_litellm_completion(scripted_gateway: RunningGateway) -> None:
    """mini-swe-agent calls models through litellm; pointed at the gateway as an OpenAI-compatible server."""
    import litellm

    _, token = new_rollout(scripted_gateway)
    out = litellm.completion(model="openai/tiny", api_base=f"{scripted_gateway.url}/v1", api_key=token,
                             messages=[{"role": "user", "content": "x?"}], tools=[LOOKUP])
    message = out.choices[0].message
    assert message.tool_calls and message.tool_calls[0].function.name == "lookup"
