"""The Responses API (what Codex speaks) through the gateway, with the official openai SDK.

FakeVLLM is scripted "call lookup, then answer", so each loop sees a real
function call; the record on Kafka is checked for exact turn reuse.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from gateway.api.responses.protocol import RESPONSES, Item, Response, ResponsesRequest, fold_items
from gateway.chat import Message, ToolCall
from gateway.readback import fold
from schemas.events import ModelCall
from schemas.rollout_token import mint
from schemas.settings import BusSettings
from tests.conftest import FINAL_REPLY, SECRET, RunningEngine, RunningGateway, gateway
from tests.factories import example
from tests.test_gateway_agents import assert_extends, calls_of
from tests.test_gateway_openai import new_rollout

LOOKUP: Any = {"type": "function", "name": "lookup", "description": "Look a word up.",
               "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}


def client(gw: RunningGateway, token: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gw.url}/v1", api_key=token, max_retries=0)


def test_a_tool_loop_with_previous_response_id_reuses_the_models_turns(scripted_gateway: RunningGateway,
                                                                       bus: BusSettings) -> None:
    rollout_id, token = new_rollout(scripted_gateway)
    sdk = client(scripted_gateway, token)
    first = sdk.responses.create(model="m", instructions="Use tools.", input="What is x?", tools=[LOOKUP])
    assert first.status == "completed"
    calls: list[Any] = [o for o in first.output if o.type == "function_call"]
    (call,) = calls
    assert call.name == "lookup" and json.loads(call.arguments) == {"q": "x"}
    # instructions are not carried over from the previous response (the API's rule): sent again
    second = sdk.responses.create(model="m", instructions="Use tools.", previous_response_id=first.id, tools=[LOOKUP],
                                  input=[{"type": "function_call_output", "call_id": call.call_id,
                                          "output": "x means 42"}])
    assert second.output_text == FINAL_REPLY and second.previous_response_id == first.id
    assert sdk.responses.retrieve(second.id).output_text == FINAL_REPLY
    recorded = calls_of(bus, rollout_id, 2)
    assert [c.api for c in recorded] == [RESPONSES, RESPONSES]
    assert_extends(recorded)  # the model's function call came back as the exact ids it sampled
    assert second.usage is not None and second.usage.input_tokens == len(recorded[1].prompt_token_ids)


def test_a_seeded_rollouts_response_ids_repeat_in_a_rerun_and_still_chain(scripted_gateway: RunningGateway) -> None:
    """A Responses client sends `previous_response_id` back: in a seeded rollout the ids come from the seed and the
    call's number, so a rerun of the rollout sends the same requests, and a stored answer is found by its id."""
    ids: dict[str, list[str]] = {}
    for name, seed in (("first", 8), ("again", 8), ("unseeded", None)):
        rollout_id = new_rollout(scripted_gateway)[0]
        sdk = client(scripted_gateway, mint(rollout_id, SECRET, seed=seed))
        first = sdk.responses.create(model="m", instructions="Use tools.", input="What is x?", tools=[LOOKUP])
        (call,) = [o for o in first.output if o.type == "function_call"]
        second = sdk.responses.create(model="m", instructions="Use tools.", previous_response_id=first.id,
                                      tools=[LOOKUP], input=[{"type": "function_call_output", "call_id": call.call_id,
                                                              "output": "x means 42"}])
        assert second.output_text == FINAL_REPLY and sdk.responses.retrieve(second.id).output_text == FINAL_REPLY
        message_ids = [o.id for o in second.output if o.type == "message"]
        ids[name] = [first.id, call.call_id, str(call.id), second.id, *message_ids]
    assert ids["first"] == ids["again"] and len(set(ids["first"])) == len(ids["first"])
    assert ids["first"][0].startswith("resp_") and not set(ids["unseeded"]) & set(ids["first"])


def test_a_client_that_sends_the_whole_input_each_time_is_reused_too(scripted_gateway: RunningGateway,
                                                                      bus: BusSettings) -> None:
    """Codex's way: store false, every item sent back, reasoning items included."""
    rollout_id, token = new_rollout(scripted_gateway)
    sdk = client(scripted_gateway, token)
    items: list[Any] = [{"type": "message", "role": "developer", "content": "Use tools."},
                        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "x?"}]}]
    first = sdk.responses.create(model="m", input=items, tools=[LOOKUP], store=False, include=[
        "reasoning.encrypted_content"], reasoning={"summary": "auto"}, prompt_cache_key="k", parallel_tool_calls=True)
    items += [{"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "opaque"},
              *[o.model_dump(exclude_none=True) for o in first.output]]
    items.append({"type": "function_call_output", "call_id": first.output[-1].call_id,  # type: ignore[union-attr]
                  "output": "x means 42"})
    second = sdk.responses.create(model="m", input=items, tools=[LOOKUP], store=False)
    assert second.output_text == FINAL_REPLY
    assert_extends(calls_of(bus, rollout_id, 2))
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(first.id)  # not stored


def test_the_stream_is_the_apis_full_event_sequence(scripted_gateway: RunningGateway) -> None:
    _, token = new_rollout(scripted_gateway)
    sdk = client(scripted_gateway, token)
    events = list(sdk.responses.create(model="m", input="x?", tools=[LOOKUP], stream=True))
    assert [e.type for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in events] == list(range(1, len(events) + 1))
    done: Any = events[-1].response  # type: ignore[union-attr]
    (call,) = done.output
    assert call.type == "function_call" and json.loads(call.arguments) == {"q": "x"}

    follow = list(sdk.responses.create(model="m", previous_response_id=done.id, stream=True, tools=[LOOKUP], input=[
        {"type": "function_call_output", "call_id": call.call_id, "output": "42"}]))
    kinds = [e.type for e in follow]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    text = "".join(e.delta for e in follow if e.type == "response.output_text.delta")
    assert text == FINAL_REPLY == follow[-1].response.output_text  # type: ignore[union-attr]


def test_a_replica_that_never_saw_the_response_continues_it_from_the_log(
        scripted_gateway: RunningGateway, fake_vllm: RunningEngine, bus: BusSettings, tiny_model: Path,
        tmp_path: Path) -> None:
    rollout_id, token = new_rollout(scripted_gateway)
    first = client(scripted_gateway, token).responses.create(model="m", input="What is x?", tools=[LOOKUP])
    with gateway(bus, fake_vllm, tiny_model, tmp_path / "other.log", scripted_gateway.run_id) as other:
        sdk = client(other, token)
        assert sdk.responses.retrieve(first.id).output[0].type == "function_call"
        call: Any = first.output[-1]
        second = sdk.responses.create(model="m", previous_response_id=first.id, tools=[LOOKUP], input=[
            {"type": "function_call_output", "call_id": call.call_id, "output": "42"}])
    assert second.output_text == FINAL_REPLY
    assert_extends(calls_of(bus, rollout_id, 2))


@pytest.mark.parametrize(("body", "param"), [
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}]}, "input"),
    ({"input": "x", "previous_response_id": "resp_unknown"}, "previous_response_id"),
    ({"input": "x", "background": True}, "background"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input"),
])
def test_what_cannot_be_honoured_is_a_400_in_openais_shape(scripted_gateway: RunningGateway, body: dict[str, Any],
                                                           param: str) -> None:
    _, token = new_rollout(scripted_gateway)
    r = httpx.post(f"{scripted_gateway.url}/v1/responses", json={"model": "m", **body},
                   headers={"authorization": f"Bearer {token}"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and r.json()["error"]["type"] == "invalid_request_error"


def test_an_output_for_a_call_the_model_never_made_is_a_400_as_openai_answers(
        scripted_gateway: RunningGateway, bus: BusSettings) -> None:
    """Neither in the stored chain of `previous_response_id` nor among the items sent: a forged tool history."""
    rollout_id, token = new_rollout(scripted_gateway)
    sdk = client(scripted_gateway, token)
    first = sdk.responses.create(model="m", input="What is x?", tools=[LOOKUP])
    made: Any = first.output[-1]
    forged = [{"type": "function_call_output", "call_id": "call_forged", "output": "42"}]
    for body in ({"previous_response_id": first.id, "input": forged},  # the chain has another call
                 {"input": [{"role": "user", "content": "What is x?"}, *forged]},  # no call at all
                 {"input": [*forged, {"type": "function_call", "call_id": "call_forged", "name": "lookup",
                                      "arguments": "{}"}]}):  # the call comes after its output
        with pytest.raises(openai.BadRequestError) as refused:
            sdk.responses.create(model="m", tools=[LOOKUP], **body)
        error: Any = refused.value.body
        assert error["param"] == "input", error
        assert error["message"] == "No tool call found for function call output with call_id call_forged."
    answered = sdk.responses.create(model="m", previous_response_id=first.id, tools=[LOOKUP], input=[
        {"type": "function_call_output", "call_id": made.call_id, "output": "42"}])
    assert answered.output_text == FINAL_REPLY
    assert [c.seq for c in calls_of(bus, rollout_id, 2)] == [0, 1]  # the refused ones took no seq


def test_an_unknown_field_is_refused_by_name(scripted_gateway: RunningGateway) -> None:
    _, token = new_rollout(scripted_gateway)
    r = httpx.post(f"{scripted_gateway.url}/v1/responses", json={"model": "m", "input": "x", "temprature": 0.5},
                   headers={"authorization": f"Bearer {token}"})
    assert r.status_code == 400 and "temprature" in r.json()["error"]["message"]


def test_function_calls_after_a_message_are_one_assistant_turn() -> None:
    items = [Item(role="user", content="x?"), Item(role="assistant", content="Let me look."),
             Item(type="function_call", call_id="c1", name="lookup", arguments='{"q": "x"}'),
             Item(type="function_call", call_id="c2", name="lookup", arguments='{"q": "y"}'),
             Item(type="reasoning"), Item(type="function_call_output", call_id="c1", output="1"),
             Item(type="function_call_output", call_id="c2", output="2")]
    assert fold_items(items) == (
        Message("user", "x?"),
        Message("assistant", "Let me look.", (ToolCall("c1", "lookup", '{"q": "x"}'),
                                              ToolCall("c2", "lookup", '{"q": "y"}'))),
        Message("tool", "1", tool_call_id="c1"), Message("tool", "2", tool_call_id="c2"))


def test_namespace_tools_are_listed_as_functions_and_their_calls_say_the_namespace() -> None:
    request = ResponsesRequest(model="m", input="x", tools=[
        {"type": "namespace", "name": "agents", "tools": [{"type": "function", "name": "spawn", "parameters": {}}]},
        LOOKUP])
    assert [t["function"]["name"] for t in request.to_chat().tools] == ["spawn", "lookup"]
    assert request.namespaces() == {"spawn": "agents"}


def test_the_fold_keeps_stored_responses_and_only_those() -> None:
    def call(seq: int, store: bool) -> ModelCall:
        body = Response(id=f"resp_{seq}", created_at=0, status="completed", model="m", output=[],
                        parallel_tool_calls=True, temperature=1.0, top_p=1.0, tool_choice="auto", tools=[], store=store)
        return replace(example(ModelCall, rollout_id="r"), seq=seq, call_id=f"c{seq}", api=RESPONSES,
                       request_json=json.dumps({"model": "m", "input": "x"}), response_json=body.model_dump_json())
    recovered = fold("r", [call(0, True), call(1, False)])
    assert recovered is not None and set(recovered.answers) == {"resp_0"}
    stored = Response.model_validate_json(recovered.answers["resp_0"][1])
    assert stored.as_messages() == ()
