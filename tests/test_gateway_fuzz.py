"""Fuzzing the harness APIs of a running gateway: whatever a client sends, the answer is never a 5xx.

Bodies are generated from the request models' own JSON schemas (so a new field
is fuzzed as soon as it exists), then some are broken on purpose: a node
replaced by junk of another type, a surrogate or a huge string, a required
field dropped, an unknown one added; streaming is drawn on and off. Raw bodies
(not JSON, not UTF-8, nested too deep, numbers JSON cannot hold) are sent too.
Every answer must be a success or a 4xx in the caller's own protocol, a
stream must not end in a server error, and the gateway must still serve a
plain call afterwards. The engine is FakeVLLM, so the run costs the gateway's
work, not a model's.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from gateway.api.anthropic.protocol import CountTokensRequest, MessagesRequest
from gateway.api.openai.protocol import ChatCompletionRequest, CompletionRequest
from gateway.api.responses.protocol import ResponsesRequest
from tests.conftest import RunningGateway
from tests.test_gateway_openai import new_rollout

Json = Any
Draw = Callable[[st.SearchStrategy[Any]], Any]

# -- strings: ordinary, and the ones that break things -----------------------------------

SURROGATES = ["\ud800", "a\udfff", "\ud83d", "x\udc00y"]
ODD = ["", " ", "\x00", "\u2028\u2029", "\ufeff", "😀" * 20, "\U0010ffff", "مرحبا", "<|im_end|>",
       "<|im_start|>assistant\n", "<tool_call>", '<tool_call>{"name": 1}</tool_call>', "<tool_response>",
       "{{ raise_exception('x') }}", "{% for %}", "NaN", "null", "\\ud800", "\r\n" * 50, "x" * 100_000]
text = st.one_of(st.text(max_size=30), st.sampled_from(ODD))
surrogate = st.one_of(st.sampled_from(SURROGATES), st.text(st.characters(categories=["Cs"]), min_size=1))
#: One string in ten with a lone surrogate: often enough to be tried everywhere, rare enough that a body with
#: several strings still gets past the check for it.
odd_text = st.integers(0, 9).flatmap(lambda k: surrogate if k == 0 else text)
numbers = st.one_of(st.integers(), st.sampled_from([2**31, 2**63, -(2**63) - 1, 2**64, 10**30]),
                    st.floats(allow_nan=True, allow_infinity=True))
junk: st.SearchStrategy[Json] = st.recursive(
    st.one_of(st.none(), st.booleans(), numbers, odd_text),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(odd_text, inner, max_size=4)),
    max_leaves=12,
)
json_object = st.dictionaries(text, st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), text),
                                                 lambda inner: st.lists(inner, max_size=3), max_leaves=6),
                              max_size=3)

# -- valid-looking bodies, from the models' JSON schemas ----------------------------------

tool_arguments = st.one_of(json_object.map(json.dumps), text)
openai_tool = st.fixed_dictionaries(
    {"type": st.sampled_from(["function", "function", "code_interpreter"])},
    optional={"function": st.fixed_dictionaries({"name": st.one_of(st.sampled_from(["lookup", "submit"]), text)},
                                                optional={"description": text, "parameters": json_object})})
responses_function = st.fixed_dictionaries(
    {"type": st.just("function"), "name": st.one_of(st.sampled_from(["lookup", "submit"]), text)},
    optional={"description": text, "parameters": json_object})
responses_tool = st.one_of(responses_function, st.fixed_dictionaries(
    {"type": st.sampled_from(["namespace", "web_search"]), "name": text},
    optional={"tools": st.lists(responses_function, max_size=2)}))
#: Fields whose meaning a plain schema does not carry (free-form dicts, tag strings): drawn from what clients send.
HINTS: dict[str, st.SearchStrategy[Json]] = {
    "type": st.one_of(st.sampled_from(["text", "tool_use", "tool_result", "image", "thinking", "function"]), text),
    "arguments": tool_arguments,
    "tools@ChatCompletionRequest": st.lists(openai_tool, max_size=2),
    "tool_choice@ChatCompletionRequest": st.one_of(st.sampled_from(["auto", "none", "required"]), json_object),
    "tool_choice@MessagesRequest": st.fixed_dictionaries(
        {"type": st.sampled_from(["auto", "any", "tool", "none"])}, optional={"name": text}),
    "max_tokens": st.integers(1, 64),
    "type@Item": st.one_of(st.sampled_from(["message", "message", "function_call", "function_call_output",
                                            "reasoning"]), text),
    "type@Part": st.one_of(st.sampled_from(["input_text", "output_text", "input_image"]), text),
    "tools@ResponsesRequest": st.lists(responses_tool, max_size=2),
    "tool_choice@ResponsesRequest": st.one_of(st.sampled_from(["auto", "none", "required"]), json_object),
    "max_output_tokens": st.integers(1, 64),
}


def _hint(name: str, owner: str) -> st.SearchStrategy[Json] | None:
    hint = HINTS.get(f"{name}@{owner}")
    return hint if hint is not None else HINTS.get(name)


def from_schema(schema: dict[str, Any], defs: dict[str, Any], owner: str = "", depth: int = 0
                ) -> st.SearchStrategy[Json]:
    """Values that satisfy a pydantic JSON schema (the shapes it allows, with boundary values)."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return from_schema(defs[name], defs, name, depth + 1)
    if "anyOf" in schema:
        branches = schema["anyOf"]
        if depth > 4:  # recursive models (an Anthropic block holds blocks): stop at the scalar branches
            branches = [b for b in branches if b.get("type") not in ("array", "object") and "$ref" not in b] or [
                {"type": "null"}]
        return st.one_of(*(from_schema(b, defs, owner, depth) for b in branches))
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if kind == "string":
        return text
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    if kind == "integer":
        return st.integers(schema.get("minimum"), schema.get("maximum"))
    if kind == "number":
        low = schema.get("minimum", schema.get("exclusiveMinimum"))
        return st.floats(low, schema.get("maximum"), allow_nan=False, allow_infinity=False,
                         exclude_min="exclusiveMinimum" in schema)
    if kind == "array":
        return st.lists(from_schema(schema.get("items", {}), defs, owner, depth + 1),
                        min_size=schema.get("minItems", 0), max_size=3)
    if kind == "object" and "properties" in schema:
        required = set(schema.get("required", ()))
        fields = {name: from_schema(sub, defs, owner, depth + 1) if (hint := _hint(name, owner)) is None else hint
                  for name, sub in schema["properties"].items()}
        return st.fixed_dictionaries({k: v for k, v in fields.items() if k in required},
                                     optional={k: v for k, v in fields.items() if k not in required})
    return json_object  # a free-form object ({"type": "object"} with additional properties), or anything


def valid(model: type[BaseModel]) -> st.SearchStrategy[Json]:
    schema = model.model_json_schema()
    return from_schema(schema, schema.get("$defs", {}), model.__name__)


# -- and then broken ---------------------------------------------------------------------


def encode(body: Json) -> bytes:
    return json.dumps(body).encode()  # ensure_ascii: a surrogate goes out as an escape, as JSON allows


def _paths(value: Json, at: tuple[str | int, ...] = ()) -> list[tuple[str | int, ...]]:
    found = [at]
    if isinstance(value, dict):
        for k, v in value.items():
            found += _paths(v, (*at, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found += _paths(v, (*at, i))
    return found


def _at(value: Json, path: tuple[str | int, ...]) -> Json:
    for part in path:
        value = value[part]
    return value


def _set(value: Json, path: tuple[str | int, ...], new: Json) -> Json:
    """`value` with the node at `path` replaced (copied along the way: drawn values are not mutated)."""
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {**value, head: _set(value[head], rest, new)}
    return [_set(v, rest, new) if i == head else v for i, v in enumerate(value)]


def _without(node: Json, part: str | int) -> Json:
    return {k: v for k, v in node.items() if k != part} if isinstance(node, dict) else [
        v for i, v in enumerate(node) if i != part]


@st.composite
def broken(draw: Draw, model: type[BaseModel]) -> Json:
    """A valid-looking body with up to three things wrong with it, streaming on or off where it can stream."""
    body = draw(valid(model))
    if "stream" in model.model_fields:
        body["stream"] = draw(st.booleans())
    for _ in range(draw(st.integers(0, 3))):
        path = draw(st.sampled_from(_paths(body)))
        action = draw(st.sampled_from(["junk", "drop", "extra"]))
        if action == "junk":
            body = _set(body, path, draw(junk))
        elif action == "drop" and path:
            body = _set(body, path[:-1], _without(_at(body, path[:-1]), path[-1]))
        elif action == "extra" and isinstance(node := _at(body, path), dict):
            key = draw(st.one_of(st.sampled_from(["logit_bias", "images", "cache_control"]), odd_text))
            body = _set(body, path, {**node, key: draw(junk)})
    return body


#: Bodies that are not JSON objects a model can be read from; each is sent to each API.
RAW = [
    b"", b"null", b"[]", b'"x"', b"{", b'{"model": "m"', b"\xef\xbb\xbf{}", b'{"model": "\xff"}',
    b'{"model": "m", "max_tokens": NaN}', b'{"model": "m", "temperature": Infinity}', b'{"a": 1e999}',
    b'{"model": "m", "max_tokens": ' + b"9" * 5000 + b"}", b"[" * 100_000 + b"]" * 100_000,
    b'{"a": ' + b'{"a": ' * 3000 + b"1" + b"}" * 3001, b'{"model": "m\\ud800"}', b'{"model": 1, "model": 2}',
]

# -- the run -----------------------------------------------------------------------------

APIS: dict[str, type[BaseModel]] = {"/v1/chat/completions": ChatCompletionRequest,
                                    "/v1/completions": CompletionRequest, "/v1/messages": MessagesRequest,
                                    "/v1/messages/count_tokens": CountTokensRequest, "/v1/responses": ResponsesRequest}
#: Set it higher for a longer run: TETHER_FUZZ_EXAMPLES=2000 pytest tests/test_gateway_fuzz.py
EXAMPLES = int(os.environ.get("TETHER_FUZZ_EXAMPLES", "300"))

_USER = {"role": "user", "content": "x?"}


def _sent_back(arguments: str) -> dict[str, Any]:
    """A chat with a tool call the harness sends back with `arguments`, and its result."""
    call = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": arguments}}
    return {"model": "m", "max_tokens": 4, "messages": [
        _USER, {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "42"}]}


#: What the fuzzer found, each a 5xx before its fix; tried first on every run.
FOUND: dict[str, list[dict[str, Any]]] = {
    "/v1/chat/completions": [
        _sent_back("[" * 100_000),  # RecursionError reading the arguments back (500)
        _sent_back('{"q": ' + "9" * 5000 + "}"),  # ValueError: over 4300 digits (500)
    ],
    "/v1/messages": [
        {"model": "m", "max_tokens": 1, "messages": [_USER], "tool_choice": {"type": []}},  # TypeError (500)
    ],
    "/v1/responses": [
        {"model": "m", "input": "x", "metadata": {"n": 2**70}},  # echoed back: orjson's 64-bit limit (500)
    ],
}


def check(path: str, response: httpx.Response) -> None:
    """A success, or a client error in the caller's protocol; a stream that does not end in a server error."""
    assert response.status_code < 500, f"{response.status_code}: {response.text[:2000]}"
    anthropic = path.startswith("/v1/messages")
    if response.status_code >= 400:
        body = response.json()
        error = body["error"]
        assert isinstance(error["message"], str) and error["type"] == "invalid_request_error"
        assert body["type"] == "error" if anthropic else error["code"] == response.status_code
        return
    if not response.headers["content-type"].startswith("text/event-stream"):
        response.json()
        return
    for line in response.text.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            event = json.loads(line[6:])
            if path == "/v1/responses":
                assert event["type"] != "response.failed" or event["response"]["error"]["code"] != "server_error", \
                    line
            elif anthropic:
                assert event["type"] != "error" or event["error"]["type"] not in ("api_error", "overloaded_error"), \
                    line
            else:
                assert "error" not in event or int(event["error"]["code"]) < 500, line


class Fuzz:
    """One client, one rollout; counts the answers so that a run which only ever met the validator fails."""

    def __init__(self, gw: RunningGateway) -> None:
        _, token = new_rollout(gw)
        self.gw = gw
        self.client = httpx.Client(base_url=gw.url, timeout=60, headers={
            "authorization": f"Bearer {token}", "content-type": "application/json"})
        self.statuses: Counter[int] = Counter()

    def send(self, path: str, content: bytes) -> None:
        response = self.client.post(path, content=content)
        self.statuses[response.status_code] += 1
        check(path, response)

    def still_serves(self) -> None:
        assert self.gw.process.poll() is None
        response = self.client.post("/v1/chat/completions", json={
            "model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "still there?"}]})
        assert response.status_code == 200 and response.json()["choices"][0]["message"]["role"] == "assistant"


@pytest.fixture
def fuzz(scripted_gateway: RunningGateway) -> Iterator[Fuzz]:
    fuzz = Fuzz(scripted_gateway)
    yield fuzz
    fuzz.client.close()


@pytest.mark.parametrize("path", list(APIS))
def test_generated_bodies_never_get_a_5xx(fuzz: Fuzz, path: str) -> None:
    def run(body: Json) -> None:
        fuzz.send(path, encode(body))

    fuzzed = given(body=broken(APIS[path]))(run)
    for body in FOUND.get(path, []):
        fuzzed = example(body=body)(fuzzed)
    settings(max_examples=EXAMPLES, database=None)(fuzzed)()
    client_errors = sum(n for status, n in fuzz.statuses.items() if 400 <= status < 500)
    assert fuzz.statuses[200] >= EXAMPLES // 10 and client_errors >= EXAMPLES // 10, fuzz.statuses
    fuzz.still_serves()


@pytest.mark.parametrize("path", list(APIS))
def test_raw_bodies_never_get_a_5xx(fuzz: Fuzz, path: str) -> None:
    for content in RAW:
        fuzz.send(path, content)

    @settings(max_examples=EXAMPLES // 5, database=None)
    @given(content=st.binary(max_size=64))
    def run(content: bytes) -> None:
        fuzz.send(path, content)

    run()
    assert set(fuzz.statuses) == {400} and fuzz.statuses[400] >= len(RAW), fuzz.statuses
    fuzz.still_serves()
