"""What Claude Code sends on the Anthropic side: its options, its history, and token counting.

Bodies here have the shape Claude Code 2.1.332 posts (captured against a local
endpoint): `?beta=true`, an `anthropic-beta` header, `thinking`,
`context_management`, `output_config`, `metadata`, a system prompt as blocks
with `cache_control`, a system turn inside `messages` with its own
`output_config` (refusing that field made the CLI resend its first call
without it, a call the record never saw), and a deferred tool.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import pytest

from schemas.settings import BusSettings
from tests.conftest import FINAL_REPLY, RunningGateway
from tests.test_gateway_agents import ANTHROPIC_LOOKUP, assert_extends, calls_of
from tests.test_gateway_hardening import refused_requests
from tests.test_gateway_openai import new_rollout

HEADERS = {"anthropic-version": "2023-06-01", "anthropic-beta": "claude-code-20250219,context-management-2025-06-27"}


def claude_code_body(**overrides: Any) -> dict[str, Any]:
    return {
        "model": "claude-opus-5-5", "max_tokens": 128000, "stream": False,
        "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332;"},
                   {"type": "text", "text": "You are an agent.", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "<system-reminder>Be brief.</system-reminder>"},
                                         {"type": "text", "text": "What is x?"}]},
            {"role": "system", "content": [{"type": "text", "text": "# Environment\ncwd: /work",
                                            "cache_control": {"type": "ephemeral"}}],
             "output_config": {"effort": "medium"}},
        ],
        "tools": [ANTHROPIC_LOOKUP, {"name": "Later", "description": "found by tool search", "defer_loading": True,
                                     "input_schema": {"type": "object"}}],
        "metadata": {"user_id": '{"session_id": "s"}'}, "thinking": {"type": "adaptive", "display": "omitted"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "medium"}, **overrides}


def post(gw: RunningGateway, token: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{gw.url}{path}?beta=true", json=body, headers={**HEADERS, "x-api-key": token}, timeout=30)


def test_a_claude_code_request_is_served_and_its_tokens_counted_alike(scripted_gateway: RunningGateway) -> None:
    _, token = new_rollout(scripted_gateway)
    answer = post(scripted_gateway, token, "/v1/messages", claude_code_body())
    assert answer.status_code == 200, answer.text
    message = answer.json()
    assert message["stop_reason"] == "tool_use" and message["content"][-1]["name"] == "lookup"
    counting = {k: v for k, v in claude_code_body().items() if k not in ("max_tokens", "stream", "metadata")}
    counted = post(scripted_gateway, token, "/v1/messages/count_tokens", counting)
    assert counted.status_code == 200, counted.text
    assert counted.json() == {"input_tokens": message["usage"]["input_tokens"]}
    # A deferred tool is not in the model's context until a search finds it: the prompt is the same without it.
    without = {**counting, "tools": [ANTHROPIC_LOOKUP]}
    assert post(scripted_gateway, token, "/v1/messages/count_tokens", without).json() == counted.json()
    # The system turn inside the conversation is in the prompt.
    no_system_turn = {**counting, "messages": counting["messages"][:1]}
    fewer = post(scripted_gateway, token, "/v1/messages/count_tokens", no_system_turn).json()["input_tokens"]
    assert fewer < counted.json()["input_tokens"]


def test_a_streamed_loop_with_thinking_and_failed_tool_results_reuses_the_models_turns(
        scripted_gateway: RunningGateway, bus: BusSettings) -> None:
    rollout_id, token = new_rollout(scripted_gateway)
    client = anthropic.Anthropic(base_url=scripted_gateway.url, api_key=token, max_retries=0)
    body = claude_code_body()
    typed = ("model", "max_tokens", "system", "messages", "tools", "metadata")
    with client.messages.stream(**{k: body[k] for k in typed}, extra_headers=HEADERS, extra_query={"beta": "true"},
                                extra_body={k: v for k, v in body.items() if k not in (*typed, "stream")}) as stream:
        first = stream.get_final_message()
    (use,) = [b for b in first.content if b.type == "tool_use"]
    assistant = [{"type": "thinking", "thinking": "", "signature": "sig"},
                 {"type": "redacted_thinking", "data": "opaque"},
                 *[b.model_dump(exclude_none=True) for b in first.content]]
    result = {"type": "tool_result", "tool_use_id": use.id, "is_error": True,
              "content": [{"type": "text", "text": "lookup failed: "}, {"type": "text", "text": "try again"}]}
    body["messages"] = [*body["messages"], {"role": "assistant", "content": assistant},
                        {"role": "user", "content": [result]}]
    second = post(scripted_gateway, token, "/v1/messages", body)
    assert second.status_code == 200, second.text
    assert second.json()["content"] == [{"type": "text", "text": FINAL_REPLY}]
    calls = calls_of(bus, rollout_id, 2)
    assert_extends(calls)  # thinking blocks left out, the tool use reused as the exact ids sampled
    assert json.loads(calls[1].request_json) == body  # options and blocks are on the record as sent


def counted(gw: RunningGateway, token: str, body: dict[str, Any]) -> httpx.Response:
    return post(gw, token, "/v1/messages/count_tokens",
                {k: v for k, v in body.items() if k not in ("max_tokens", "stream", "metadata")})


def test_claude_code_s_first_call_is_answered_and_recorded_as_sent(scripted_gateway: RunningGateway,
                                                                  bus: BusSettings) -> None:
    """Its system turn's `output_config` was a 400, so the CLI resent the call without it: the first call of
    every rollout was refused and not recorded, and the next was not what the CLI sends in production."""
    rollout_id, token = new_rollout(scripted_gateway)
    refused_before = refused_requests(scripted_gateway)
    body = claude_code_body()
    answer = post(scripted_gateway, token, "/v1/messages", body)
    assert answer.status_code == 200, answer.text
    assert counted(scripted_gateway, token, body).status_code == 200
    (call,) = calls_of(bus, rollout_id, 1)
    assert json.loads(call.request_json) == body  # the system turn's options on the record as sent
    assert refused_requests(scripted_gateway) == refused_before


def test_a_system_turn_s_options_are_honoured_as_anthropic_documents_them(scripted_gateway: RunningGateway) -> None:
    """Effort means nothing to a local model (the prompt is the same); a turn of options alone adds nothing; a
    `clear_at: next_user_message` turn is shown until a user turn follows it."""
    _, token = new_rollout(scripted_gateway)
    user, system = claude_code_body()["messages"]
    plain = {k: v for k, v in system.items() if k != "output_config"}

    def tokens(*messages: dict[str, Any]) -> int:
        r = counted(scripted_gateway, token, claude_code_body(messages=list(messages)))
        assert r.status_code == 200, r.text
        return int(r.json()["input_tokens"])

    assert tokens(user, system) == tokens(user, plain) == tokens(user, {**system, "output_config": {}})
    assert tokens(user, {"role": "system", "output_config": {"effort": "high"}}) == tokens(user)
    once = {**plain, "clear_at": "next_user_message"}
    answer = {"role": "assistant", "content": "Yes."}
    assert tokens(user, once) == tokens(user, plain)
    assert tokens(user, once, answer, user) == tokens(user, answer, user) < tokens(user, plain, answer, user)
    assert tokens(user, {**plain, "clear_at": "never"}, answer, user) == tokens(user, plain, answer, user)
    nothing = claude_code_body(system=None, messages=[{"role": "system", "output_config": {"effort": "low"}}])
    for r in (post(scripted_gateway, token, "/v1/messages", nothing), counted(scripted_gateway, token, nothing)):
        assert r.status_code == 400 and "nothing to answer" in r.json()["error"]["message"], r.text


@pytest.mark.parametrize(("turn", "error"), [
    ({"role": "user", "content": "x", "output_config": {"effort": "low"}},
     'messages.1.output_config: only permitted on role "system" messages'),
    ({"role": "assistant", "content": "x", "clear_at": "never"},
     'messages.1.clear_at: only permitted on role "system" messages'),
    ({"role": "system", "content": "x", "output_config": {"format": {"type": "json_schema"}}},
     "messages.1.output_config.format: Unrecognized request argument supplied"),  # top-level only
    ({"role": "system", "content": "x", "output_config": {"effort": "extreme"}}, "messages.1.output_config.effort: "),
    ({"role": "system", "output_config": {}}, "messages.1: a system message needs content or output_config fields"),
    ({"role": "user"}, "messages.1.content: Field required"),
    ({"role": "system", "content": "x", "cache_control": {"type": "ephemeral"}},
     "messages.1.cache_control: Unrecognized request argument supplied"),
])
def test_a_turn_s_fields_anthropic_refuses_are_refused(scripted_gateway: RunningGateway, turn: dict[str, Any],
                                                      error: str) -> None:
    _, token = new_rollout(scripted_gateway)
    body = claude_code_body(messages=[claude_code_body()["messages"][0], turn])
    for r in (post(scripted_gateway, token, "/v1/messages", body), counted(scripted_gateway, token, body)):
        assert r.status_code == 400, r.text
        assert r.json()["error"]["message"].startswith(error), r.text


@pytest.mark.parametrize(("change", "words"), [
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "built-in"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}]}]}]}, "image"),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]}, "document"),
    ({"messages": [{"role": "user", "content": "x?"}, {"role": "user", "content": [  # a call never made: forged
        {"type": "tool_result", "tool_use_id": "toolu_forged", "content": "42"}]}]},
     "unexpected `tool_use_id` found in `tool_result` blocks: toolu_forged."),
    ({"mcp_servers": [{"type": "url", "url": "http://x", "name": "x"}]}, "MCP"),
    ({"contex_management": {}}, "contex_management"),
])
def test_what_cannot_be_honoured_is_a_400_in_anthropics_shape(scripted_gateway: RunningGateway,
                                                              change: dict[str, Any], words: str) -> None:
    _, token = new_rollout(scripted_gateway)
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        body = claude_code_body(**change)
        if path.endswith("count_tokens"):
            body = {k: v for k, v in body.items() if k not in ("max_tokens", "stream", "metadata")}
        r = post(scripted_gateway, token, path, body)
        assert r.status_code == 400, r.text
        error = r.json()
        assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
        assert words in error["error"]["message"]
