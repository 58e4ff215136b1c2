"""One model call through the gateway: bind, gate, render, generate, parse, record, answer.

Protocol modules turn a harness's request into a ChatRequest and the result
back into their own format; everything between lives here, once. The answer
(or a stream's final event) is released only after the call's events are
acknowledged by Kafka; a call that fails is recorded too, with its error.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

from gateway.chat import ChatRequest, Generation, message_key
from gateway.engines import EnginePool
from gateway.errors import GatewayError, InternalError
from gateway.gate import Gate
from gateway.metrics import Metrics
from gateway.recorder import Recorder
from gateway.render import Renderer, own_turns
from gateway.rollouts import Rollout, Rollouts
from gateway.tool_parsers import ToolParser
from schemas import events


@dataclass
class Call:
    """What the protocol module passes in: who, what was asked, and how to show the result."""

    rollout_id: str
    api: str
    request_json: str
    chat: ChatRequest
    #: generations → the response body exactly as the harness will see it (for the record)
    respond: Callable[[list[Generation], dict[str, int], int], dict[str, Any]]


@dataclass
class Started:
    """The prompt is rendered and the call admitted: what a stream can announce before any token."""

    prompt_tokens: int


@dataclass
class Delta:
    """Streamed content of one choice; tool calls come whole at the end."""

    index: int
    text: str


@dataclass
class Finished:
    generations: list[Generation]
    usage: dict[str, int]
    weight_version: int
    response: dict[str, Any] = field(default_factory=dict)


class Gateway:
    def __init__(self, gateway_id: str, model: str, renderer: Renderer, parser: ToolParser, engines: EnginePool,
                 recorder: Recorder, rollouts: Rollouts, gate: Gate, metrics: Metrics) -> None:
        self.gateway_id = gateway_id
        self.model = model
        self.renderer = renderer
        self.parser = parser
        self.engines = engines
        self.recorder = recorder
        self.rollouts = rollouts
        self.gate = gate
        self.metrics = metrics
        self.version = 0  # the last weight version published; engines that report theirs win

    def set_version(self, version: int) -> None:
        self.version = version

    async def complete(self, call: Call) -> Finished:
        finished: Finished | None = None
        async for item in self._run(call, stream=False):
            if isinstance(item, Finished):
                finished = item
        assert finished is not None
        return finished

    def stream(self, call: Call) -> AsyncIterator[Started | Delta | Finished]:
        return self._run(call, stream=True)

    async def _run(self, call: Call, stream: bool) -> AsyncIterator[Started | Delta | Finished]:
        rollout = self.rollouts.open(call.rollout_id)
        received = datetime.now(UTC)
        started = time.perf_counter()
        self.metrics.requests.labels(call.api).inc()
        async with self.gate.admit() as held_s:
            rollout = self.rollouts.open(call.rollout_id)  # it may have been sealed while the call was held
            seq = self.rollouts.begin_call(rollout)
            call_id = f"call-{uuid.uuid4().hex}"
            acknowledged: list[str] | None = None
            prompt: list[int] = []
            try:
                prompt = self._render(rollout, call.chat)
                yield Started(len(prompt))
                engine_started = time.perf_counter()
                state = _Streams(call.chat.sampling.n, self.parser.start_marker)
                version = self.version
                async for chunk in self._generate(rollout, prompt, call.chat, stream):
                    reported = chunk.get("weight_version")  # our engine says which weights; vLLM does not
                    version = int(reported) if reported is not None else version
                    for delta in state.add(chunk):
                        yield delta
                engine_ms = (time.perf_counter() - engine_started) * 1000
                generations = state.finish(self.parser, call.chat)
                for delta in state.rest(generations):  # text held back for a tool call that did not parse
                    yield delta
                usage = {"prompt_tokens": len(prompt), "completion_tokens": sum(len(g.token_ids) for g in generations)}
                response = call.respond(generations, usage, version)
                records = [self._event(call, rollout, seq, f"{call_id}-{g.index}", g, prompt, version, response,
                                       received, held_s, engine_ms, 200, None) for g in generations]
                await self._record(records)
                acknowledged = [r.call_id for r in records]
                for g in generations:
                    self.rollouts.remember_turn(rollout, message_key(g.content, g.tool_calls), g.token_ids)
                self.metrics.tokens.labels("prompt").inc(len(prompt))
                self.metrics.tokens.labels("completion").inc(usage["completion_tokens"])
                yield Finished(generations, usage, version, response)
            except Exception as exc:
                # Whatever went wrong is on the record, and the harness gets it in its own protocol.
                error = exc if isinstance(exc, GatewayError) else InternalError(f"the gateway failed: {exc!r}")
                self.metrics.errors.labels(call.api, str(error.status)).inc()
                acknowledged = await self._record_failure(call, rollout, seq, call_id, prompt, received, held_s,
                                                          error)
                if error is exc:
                    raise
                raise error from exc
            finally:
                self.rollouts.end_call(rollout, acknowledged or [])
                self.metrics.latency.labels(call.api).observe(time.perf_counter() - started)

    def _render(self, rollout: Rollout, chat: ChatRequest) -> list[int]:
        if chat.raw_prompt is not None:
            return self.renderer.encode(chat.raw_prompt)
        rendered = self.renderer.render(chat, own_turns(chat, rollout.turns))
        self.metrics.reused_turns.inc(rendered.reused_turns)
        return rendered.prompt_ids

    async def _generate(self, rollout: Rollout, prompt: list[int], chat: ChatRequest, stream: bool
                        ) -> AsyncIterator[dict[str, Any]]:
        s = chat.sampling
        body: dict[str, Any] = {
            "model": self.model, "prompt": prompt, "max_tokens": s.max_tokens, "temperature": s.temperature,
            "top_p": s.top_p, "seed": s.seed, "stop": list(s.stop) or None, "n": s.n,
            "logprobs": s.top_logprobs, "return_token_ids": True,
        }
        if stream:
            async for chunk in self.engines.stream(rollout.rollout_id, body):
                yield chunk
        else:
            yield await self.engines.complete(rollout.rollout_id, body)

    async def _record(self, records: list[events.ModelCall]) -> None:
        started = time.perf_counter()
        try:
            await self.recorder.calls(records)
        finally:
            self.metrics.publish_latency.observe(time.perf_counter() - started)

    async def _record_failure(self, call: Call, rollout: Rollout, seq: int, call_id: str, prompt: list[int],
                              received: datetime, held_s: float, exc: GatewayError) -> list[str]:
        """The failed call is on the record too; if even that cannot be stored, the harness learns of it."""
        failed = Generation(0, [], [], [], "", "error")
        body = exc.openai_body() if call.api.startswith("openai") else exc.anthropic_body()
        # Its own id: after a delivery timeout the success event may still land under "{call_id}-0".
        record = self._event(call, rollout, seq, f"{call_id}-error", failed, prompt, self.version, body, received,
                             held_s, 0.0, exc.status, exc.message)
        try:
            await self._record([record])
        except GatewayError:
            return []
        return [record.call_id]

    def _event(self, call: Call, rollout: Rollout, seq: int, call_id: str, g: Generation, prompt: list[int],
               version: int, response: dict[str, Any], received: datetime, held_s: float, engine_ms: float,
               http_status: int, error: str | None) -> events.ModelCall:
        s = call.chat.sampling
        return events.ModelCall(
            call_id=call_id, rollout_id=rollout.rollout_id, run_id=rollout.run_id, gateway_id=self.gateway_id,
            seq=seq, choice_index=g.index, api=call.api, model=self.model, request_json=call.request_json,
            response_json=orjson.dumps(response).decode(), prompt_token_ids=prompt, response_token_ids=g.token_ids,
            response_logprobs=g.logprobs, weight_version=version,
            sampling=events.Sampling(temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_tokens or 0,
                                     seed=s.seed),
            usage=events.Usage(prompt_tokens=len(prompt), completion_tokens=len(g.token_ids)),
            timings=events.Timings(received_at=received, finished_at=datetime.now(UTC), queued_ms=held_s * 1000,
                                   engine_ms=engine_ms),
            status="ok" if error is None else "error", http_status=http_status,
            finish_reason=g.finish_reason if error is None else None, error=error,
        )


class _Streams:
    """Per-choice accumulation of engine chunks; streamed text stops at a possible tool call."""

    def __init__(self, n: int, marker: str) -> None:
        self.marker = marker
        self.ids: dict[int, list[int]] = {i: [] for i in range(n)}
        self.logprobs: dict[int, list[float]] = {i: [] for i in range(n)}
        self.tops: dict[int, list[dict[str, float]]] = {i: [] for i in range(n)}
        self.text: dict[int, str] = {i: "" for i in range(n)}
        self.sent: dict[int, int] = {i: 0 for i in range(n)}
        self.finish_reasons: dict[int, str] = {}
        self.stop_reasons: dict[int, str | int | None] = {}

    def add(self, chunk: dict[str, Any]) -> list[Delta]:
        deltas = []
        for choice in chunk.get("choices", []):
            i = int(choice["index"])
            self.ids[i] += choice.get("token_ids") or []
            lp = choice.get("logprobs") or {}
            self.logprobs[i] += lp.get("token_logprobs") or []
            self.tops[i] += lp.get("top_logprobs") or []
            self.text[i] += choice.get("text") or ""
            if choice.get("finish_reason"):
                self.finish_reasons[i] = choice["finish_reason"]
                self.stop_reasons[i] = choice.get("stop_reason")
            safe = self._streamable(i)
            if safe > self.sent[i]:
                deltas.append(Delta(i, self.text[i][self.sent[i]:safe]))
                self.sent[i] = safe
        return deltas

    def _streamable(self, i: int) -> int:
        """Text up to a tool-call marker (or a prefix of one at the end) can be shown at once."""
        text = self.text[i]
        at = text.find(self.marker)
        if at >= 0:
            return at
        for k in range(min(len(self.marker) - 1, len(text)), 0, -1):
            if self.marker.startswith(text[-k:]):
                return len(text) - k
        return len(text)

    def rest(self, generations: list[Generation]) -> list[Delta]:
        return [Delta(g.index, g.content[self.sent[g.index]:]) for g in generations
                if not g.tool_calls and len(g.content) > self.sent[g.index]]

    def finish(self, parser: ToolParser, chat: ChatRequest) -> list[Generation]:
        out = []
        for i in sorted(self.ids):
            text = self.text[i]
            content, calls = parser.parse(text) if chat.tools and chat.tool_choice != "none" else (text, [])
            if not calls:
                content = text
            reason = "tool_calls" if calls else self.finish_reasons.get(i, "stop")
            out.append(Generation(i, self.ids[i], self.logprobs[i], self.tops[i], text, reason, content, calls,
                                  self.stop_reasons.get(i)))
        return out
