"""The gateway as a new user meets it: development keys kept off the network, odd text refused in the caller's
protocol (never a 5xx)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import APIRouter, FastAPI
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from gateway import serve as serve_module
from gateway.http.refusals import AnthropicRoute, OpenAIRoute
from gateway.settings import DevelopmentKeysExposed, GatewaySettings
from tests.conftest import RunningGateway
from tests.test_gateway_openai import new_rollout
from tether import cli

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



@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("path", "field", "value"), [
    ("/v1/chat/completions", "max_tokens", 2**31), ("/v1/chat/completions", "max_completion_tokens", 2**31),
    ("/v1/chat/completions", "seed", 2**63), ("/v1/chat/completions", "seed", -(2**63) - 1),
    ("/v1/completions", "max_tokens", 2**31), ("/v1/completions", "seed", 2**63), ("/v1/messages", "max_tokens", 2**31),
])
def test_numbers_the_record_cannot_hold_are_refused_before_the_engine_runs(
        scripted_gateway: RunningGateway, path: str, field: str, value: int, stream: bool) -> None:
    """They were a 400 only once the call failed to be recorded, or an error event after a streamed answer."""
    response = post(scripted_gateway, path, {**paired(path), field: value, "stream": stream})
    assert response.status_code == 400 and error_message(path, response).startswith(f"{field}: ")


@pytest.mark.parametrize(("route", "shape"), [
    (OpenAIRoute, {"error": {"message": "the gateway failed: RuntimeError('a bug')", "type": "server_error",
                             "param": None, "code": 500}}),
    (AnthropicRoute, {"type": "error", "error": {"type": "api_error",
                                                 "message": "the gateway failed: RuntimeError('a bug')"}}),
])
def test_a_bug_is_still_answered_in_the_callers_protocol(route: type[OpenAIRoute], shape: dict[str, Any]) -> None:
    """Not Starlette's bare text "Internal Server Error", which no SDK can read (what tool_choice {"type": []} got)."""
    router = APIRouter(route_class=route)

    @router.post("/v1/x")
    async def broken() -> None:
        raise RuntimeError("a bug")

    app = FastAPI()
    app.include_router(router)
    response = TestClient(app).post("/v1/x")
    assert response.status_code == 500 and response.json() == shape


def test_a_long_streamed_prompt_is_answered(scripted_gateway: RunningGateway) -> None:
    """Found by the fuzzer: a prompt whose token ids pass 512 KiB as JSON (~100k tokens, within a 128k-context
    model's reach) got an api_error event (aiohttp's LineTooLong) after a 200 when streamed; the engine's first
    chunk carries the prompt's token ids."""
    body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "x" * 200_000}]}
    assert post(scripted_gateway, "/v1/chat/completions", body).status_code == 200
    streamed = post(scripted_gateway, "/v1/chat/completions", {**body, "stream": True})
    assert streamed.status_code == 200 and '"error"' not in streamed.text, streamed.text[-300:]

# -- the gateway's own record of what it refused ------------------------------------------

REFUSED = "tether_gateway_refused_requests"


def refused_requests(gw: RunningGateway) -> dict[tuple[str, str], float]:
    """The requests the gateway answered with an error, by (route, status), from its own /metrics. Fails if it
    counts none at all: then a request refused while parsing would leave no trace but the answer."""
    text = httpx.get(f"{gw.url}/metrics", timeout=10).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert REFUSED in families, "the gateway serves no count of the requests it refused"
    return {(s.labels["route"], s.labels["status"]): s.value for s in families[REFUSED].samples
            if s.name == f"{REFUSED}_total"}


def test_every_refused_request_is_counted_by_route_and_status_and_logged_without_its_key(
        scripted_gateway: RunningGateway) -> None:
    """Refused before the service runs, such a request is in no record of calls: the count and the log line are
    its trace, on every route (harness APIs at the root and bound by path, admin)."""
    rollout_id, token = new_rollout(scripted_gateway)
    _, other = new_rollout(scripted_gateway)
    chat = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    url, wrong_key = scripted_gateway.url, {"authorization": f"Bearer {other}"}
    before = refused_requests(scripted_gateway)
    answers = {
        ("/v1/messages", "400"): httpx.post(f"{url}/v1/messages", json={**chat, "bogus_option": 1},
                                            headers={"x-api-key": token}),
        ("/v1/chat/completions", "401"): httpx.post(f"{url}/v1/chat/completions", json=chat),
        ("/rollouts/{rollout_id}/v1/chat/completions", "403"): httpx.post(
            f"{url}/rollouts/{rollout_id}/v1/chat/completions", json=chat, headers=wrong_key),
        ("/admin/rollouts", "401"): httpx.post(f"{url}/admin/rollouts", json={"rollout_id": "x", "run_id": "y"}),
    }
    assert {key: r.status_code for key, r in answers.items()} == {key: int(key[1]) for key in answers}
    after = refused_requests(scripted_gateway)
    assert {key: after.get(key, 0) - before.get(key, 0) for key in answers} == dict.fromkeys(answers, 1)
    assert httpx.post(f"{url}/v1/messages", json=chat, headers={"x-api-key": token}).status_code == 200
    assert refused_requests(scripted_gateway) == after  # an answered call is not counted
    log = scripted_gateway.log.read_text(errors="replace")
    assert "refused POST /v1/messages: 400 bogus_option: Unrecognized request argument supplied" in log
    assert f"refused POST /rollouts/{rollout_id}/v1/chat/completions: 403 " in log
    assert token not in log and other not in log


# -- development keys stay on this machine ----------------------------------------------

SECRET, ADMIN_KEY = "a-real-secret-1", "a-real-admin-key-1"


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("SECRET", "ADMIN_KEY", "CONFIG", "HOST"):
        monkeypatch.delenv(f"TETHER_GATEWAY_{name}", raising=False)
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    return monkeypatch


@pytest.mark.parametrize("host", ["127.0.0.1", "127.8.9.10", "localhost", "LOCALHOST", "::1", "[::1]",
                                  "::ffff:127.0.0.1"])
def test_loopback_serves_with_the_development_keys(clean_env: pytest.MonkeyPatch, host: str) -> None:
    GatewaySettings(host=host).check_exposure()


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "192.168.0.7", "2001:db8::1", "gateway.internal",
                                  "localhost.example.com", "128.0.0.1"])
def test_other_addresses_refuse_each_development_key_by_its_variable(clean_env: pytest.MonkeyPatch,
                                                                     host: str) -> None:
    with pytest.raises(DevelopmentKeysExposed) as both:
        GatewaySettings(host=host).check_exposure()
    assert "TETHER_GATEWAY_SECRET and TETHER_GATEWAY_ADMIN_KEY" in str(both.value)
    with pytest.raises(DevelopmentKeysExposed) as one:
        GatewaySettings(host=host, secret=SECRET).check_exposure()
    assert "TETHER_GATEWAY_ADMIN_KEY" in str(one.value) and "TETHER_GATEWAY_SECRET" not in str(one.value)
    clean_env.setenv("TETHER_GATEWAY_ADMIN_KEY", ADMIN_KEY)  # from the environment, as deployed
    with pytest.raises(DevelopmentKeysExposed, match="set TETHER_GATEWAY_SECRET "):
        GatewaySettings(host=host).check_exposure()
    GatewaySettings(host=host, secret=SECRET, admin_key=ADMIN_KEY).check_exposure()


def test_serve_refuses_with_one_line_and_no_traceback(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_GATEWAY_")}
    done = subprocess.run([sys.executable, "-m", "tether.cli", "gateway", "serve", "--host", "0.0.0.0",
                           "--tokenizer", str(tmp_path)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("tether: refusing to serve on 0.0.0.0 with the built-in development secret and admin key")
    assert "TETHER_GATEWAY_SECRET and TETHER_GATEWAY_ADMIN_KEY" in line


@pytest.mark.parametrize(("host", "env"), [("127.0.0.1", {}), ("0.0.0.0", {
    "TETHER_GATEWAY_SECRET": SECRET, "TETHER_GATEWAY_ADMIN_KEY": ADMIN_KEY})])
def test_serve_listens_where_it_may(clean_env: pytest.MonkeyPatch, tmp_path: Path, host: str,
                                    env: dict[str, str]) -> None:
    (tmp_path / "tokenizer.json").write_text("{}")
    listened: list[str] = []
    clean_env.setattr(serve_module, "create_app", lambda settings: settings)
    clean_env.setattr(serve_module, "serve_app", lambda app, host, **_: listened.append(host))  # what serve calls
    result = CliRunner().invoke(cli.app, ["gateway", "serve", "--host", host, "--tokenizer", str(tmp_path)], env=env)
    assert result.exit_code == 0, result.output
    assert listened == [host]
