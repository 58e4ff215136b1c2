"""The gateway as a new user meets it: odd text refused in the caller's protocol, never a 5xx."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.conftest import RunningGateway
from tests.test_gateway_openai import new_rollout

# -- lone UTF-16 surrogates: a 400 naming the field, in the caller's protocol ----------

SURROGATE = "a\ud800b"  # json.dumps writes it as the escape "\ud800", as a careless client would send it

BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": SURROGATE}]},
    "/v1/completions": {"model": "m", "max_tokens": 4, "prompt": SURROGATE},
    "/v1/messages": {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": SURROGATE}]},
}
FIELDS = {"/v1/chat/completions": "messages.0.content", "/v1/completions": "prompt",
          "/v1/messages": "messages.0.content"}


def paired(path: str) -> dict[str, Any]:
    """The body with a valid surrogate pair (an emoji, as ASCII-only JSON writers send it) in place of the lone one."""
    body: dict[str, Any] = json.loads(json.dumps(BODIES[path]).replace("\\ud800", "\\ud83d\\ude00"))
    return body


def post(gw: RunningGateway, path: str, body: dict[str, Any] | str | bytes) -> httpx.Response:
    _, token = new_rollout(gw)
    content = body if isinstance(body, str | bytes) else json.dumps(body)
    return httpx.post(f"{gw.url}{path}", content=content, timeout=30,
                      headers={"authorization": f"Bearer {token}", "content-type": "application/json"})


def error_message(path: str, response: httpx.Response) -> str:
    """The error's message, checked to be in the shape the caller's SDK parses."""
    body = response.json()
    if path == "/v1/messages":
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        return str(body["error"]["message"])
    assert body["error"]["type"] == "invalid_request_error" and body["error"]["code"] == 400
    return str(body["error"]["message"])


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", list(BODIES))
def test_a_lone_surrogate_is_a_400_naming_the_field(scripted_gateway: RunningGateway, path: str,
                                                    stream: bool) -> None:
    response = post(scripted_gateway, path, {**BODIES[path], "stream": stream})
    assert response.status_code == 400, response.text
    message = error_message(path, response)
    assert FIELDS[path] in message and "surrogate" in message
    if path != "/v1/messages":
        assert response.json()["error"]["param"] == FIELDS[path]


@pytest.mark.parametrize("path", list(BODIES))
def test_surrogates_anywhere_are_refused_but_pairs_are_text(scripted_gateway: RunningGateway, path: str) -> None:
    assert post(scripted_gateway, path, paired(path)).status_code == 200
    response = post(scripted_gateway, path, {**paired(path), "model": "m\udfff"})
    assert response.status_code == 400 and error_message(path, response).startswith("model: ")
    if path != "/v1/completions":  # in a name: the field is shown escaped, the error body stays valid UTF-8
        response = post(scripted_gateway, path, {**paired(path), "metadata": {"k\udc00": 1}})
        assert response.status_code == 400 and error_message(path, response).startswith("metadata.k\\udc00: ")


@pytest.mark.parametrize("path", list(BODIES))
@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e999", "9" * 5000],
                         ids=["nan", "infinity", "-infinity", "overflow", "5000-digits"])
def test_numbers_json_cannot_carry_are_a_400(scripted_gateway: RunningGateway, path: str, number: str) -> None:
    """Python's json reads NaN and Infinity, overflows 1e999 to infinity, and refuses 5000 digits with a
    ValueError (that one was a 500)."""
    body = json.dumps(paired(path)).replace('"max_tokens": 4', f'"max_tokens": {number}')
    response = post(scripted_gateway, path, body)
    assert response.status_code == 400 and error_message(path, response).startswith("malformed JSON body")
