"""One model call through the gateway: bind, gate, render, generate, parse, record, answer.

Protocol modules turn a harness's request into a ChatRequest and the result
back into their own format; everything between lives here, once. The answer
(or a stream's final event) is released only after the call's events are
acknowledged by Kafka; a call that fails is recorded too, with its error.
Sealing a rollout and a harness's reward are recorded here as well, so the
HTTP layer only binds, parses and answers.

A rollout this process does not hold (it restarted, or another replica served
the rollout so far) is restored from the log before its call is served, and a
seal lists the calls the log holds for the rollout, whichever replica served
them (docs/architecture.md, "Failure and recovery").
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import orjson
from pydantic import BaseModel

from gateway.adapters import EngineKind, model_fields, token_fields
from gateway.chat import ChatRequest, Finished, Generation, Started, TokenUsage, message_key, seeded_tool_calls
from gateway.choices import Choices, Delta
from gateway.errors import GatewayError, HistoryUnavailable, InternalError, InvalidRequest, RolloutNotFound
from gateway.extends import Extension, extension, packed, tip
from gateway.gate import Gate
from gateway.metrics import Metrics
from gateway.readback import Recovered, RolloutReader
from gateway.recorder import Recorder
from gateway.render import Renderer, RenderState, differs, own_turns
from gateway.rollouts import Rollout, Rollouts
from gateway.tool_parsers import ToolParser
from gateway.upstream import EnginePool
from schemas import events
from schemas.errors import BusError
from schemas.seeds import call_seed, seeded_name

log = logging.getLogger("tether.gateway")


@dataclass(kw_only=True)
class Call:
    """What the protocol module passes in: who, what was asked, and how to show the result."""

    rollout_id: str
    api: str
    request_json: str
    chat: ChatRequest
    #: generations, usage, weight version → the response body exactly as the harness will see it (and the record)
    respond: Callable[[list[Generation], TokenUsage, int], BaseModel]
    issued_at: float | None = None  # when the rollout's token was minted: its history starts no earlier
    #: the rollout's seed (its token's): a call that names none samples with one derived from it and its number
    seed: int | None = None
    #: an id under which the answer stays retrievable while the rollout is open (Responses' `store`)
    keep_as: str | None = None
    #: names the answer from 64 hex digits and returns its id (`Responder.rename`); seeded calls use it
    rename: Callable[[str], str] | None = None


@dataclass(kw_only=True)
class _Attempt:
    """One admitted call: what each of its events shares, whichever way it ends."""

    call: Call
    rollout: Rollout
    seq: int
    call_id: str
    received: datetime
    held_s: float
    prompt: list[int] = field(default_factory=list)
    rendered: RenderState | None = None  # where its rendering stopped: released for the next call's when it ends
    recorded: Extension | None = None  # how its prompt and request are recorded (against an earlier call)
    pending: list[str] = field(default_factory=list)  # its events sent to Kafka
    acknowledged: list[str] = field(default_factory=list)  # those Kafka acknowledged


@dataclass(frozen=True, kw_only=True)
class _Outcome:
    """How the call ended: the same for every choice it records."""

    weight_version: int
    response_json: str
    engine_ms: float = 0.0
    error: GatewayError | None = None


class Gateway:
    """The gateway's work behind every HTTP API: model calls, and the rollouts they are recorded into."""

    def __init__(self, *, gateway_id: str, model: str, renderer: Renderer, parser: ToolParser,
                 engines: EnginePool, recorder: Recorder, rollouts: Rollouts, gate: Gate, metrics: Metrics,
                 history: RolloutReader, resume_rendering: bool = True, render_check_every: int = 0,
                 engine_kind: EngineKind = "tether") -> None:
        self.gateway_id = gateway_id
        self.model = model
        self.engine_kind: EngineKind = engine_kind
        self.adapter = False  # the versions published are adapters on the base (lora): ask the engine for them
        self.renderer = renderer
        self.parser = parser
        self.engines = engines
        self.recorder = recorder
        self.rollouts = rollouts
        self.gate = gate
        self.metrics = metrics
        self.history = history  # the log, where rollouts this process does not hold are read back
        self.version = 0  # the last weight version published; engines that report theirs win
        self._restoring: dict[str, asyncio.Task[Rollout]] = {}
        self.resume_rendering = resume_rendering
        self.render_check_every = render_check_every
        self._renders = 0

    def set_version(self, version: int, adapter: bool = False) -> None:
        self.version, self.adapter = version, adapter

    # -- rollouts ----------------------------------------------------------------

    def register(self, rollout_id: str, run_id: str) -> Rollout:
        return self.rollouts.register(rollout_id, run_id)

    async def rollout(self, rollout_id: str, issued_at: float | None = None) -> Rollout:
        """The rollout from memory, or else from the log: read once, however many calls ask at the same time.
        `issued_at` (its token's) bounds how far back its history can start."""
        found = self.rollouts.find(rollout_id)
        if found is not None:
            return found
        task = self._restoring.get(rollout_id)
        if task is None:
            since = issued_at if issued_at is not None else time.time() - self.history.window_s
            task = self._restoring[rollout_id] = asyncio.create_task(self._restore(rollout_id, since))
            task.add_done_callback(lambda _: self._restoring.pop(rollout_id, None))
        return await asyncio.shield(task)

    async def _read(self, rollout_id: str, since: float, whole: bool = True) -> Recovered | None:
        try:
            return await self.history.read(rollout_id, since, whole)
        except BusError as exc:
            raise HistoryUnavailable(f"rollout {rollout_id!r} could not be read back from Kafka: {exc}",
                                     retry_after_s=2) from exc

    async def _restore(self, rollout_id: str, since: float) -> Rollout:
        started = time.perf_counter()
        recovered = await self._read(rollout_id, since)
        if recovered is None:
            raise RolloutNotFound(f"rollout {rollout_id!r} is not registered with this gateway, and the log has "
                                  "no record of it")
        rollout = self.rollouts.restore(rollout_id, recovered, since)
        self.metrics.restored.inc()
        log.info("restored rollout %s from the log in %.0f ms: %d calls, next seq %d%s", rollout_id,
                 (time.perf_counter() - started) * 1000, len(recovered.acknowledged), recovered.next_seq,
                 ", sealed" if recovered.sealed else "")
        return rollout

    async def seal(self, rollout_id: str) -> list[str]:
        """Close the rollout once its calls in flight are done; its RolloutSealed lists the calls Kafka has for
        it, whichever replica served them. The call ids are returned."""
        rollout = await self.rollout(rollout_id)
        await self.rollouts.seal(rollout_id)
        logged = await self._read(rollout_id, rollout.since, whole=False)  # its calls' ids are what a seal lists
        if logged is not None and logged.sealed:
            return logged.acknowledged  # sealed before, maybe by another replica: that record stands
        call_ids = [c for c in (logged.acknowledged if logged else []) if c not in rollout.unacknowledged]
        call_ids += [c for c in rollout.acknowledged if c not in set(call_ids)]  # (all are logged once acked)
        rollout.acknowledged = call_ids
        await self.recorder.event(events.RolloutSealed(rollout_id=rollout_id, run_id=rollout.run_id,
                                                       call_ids=call_ids))
        return call_ids

    async def report_reward(self, rollout_id: str, reward: float, details: dict[str, Any] | None,
                            issued_at: float | None = None, call_id: str | None = None) -> None:
        """A harness's own reward for its rollout, or for one of its calls (`call_id`: a step reward), on the
        record next to its calls. A call is named as the gateway named it to the harness (x-tether-call-id)."""
        rollout = await self.rollout(rollout_id, issued_at)
        if not math.isfinite(reward):
            raise InvalidRequest("reward must be a finite number", "reward")
        if call_id is not None and not any(c == call_id or c.rsplit("-", 1)[0] == call_id
                                           for c in rollout.acknowledged):
            raise InvalidRequest(f"call {call_id!r} is not a recorded call of rollout {rollout_id!r}", "call_id")
        await self.recorder.event(events.RewardReported(
            rollout_id=rollout_id, run_id=rollout.run_id, reward=reward, source="harness",
            details_json=json.dumps(details) if details is not None else None, call_id=call_id))

    # -- model calls -------------------------------------------------------------

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
        await self.rollout(call.rollout_id, call.issued_at)
        self.rollouts.open(call.rollout_id)
        received = datetime.now(UTC)
        started = time.perf_counter()
        self.metrics.requests.labels(call.api).inc()
        async with self.gate.admit() as held_s:
            await self.rollout(call.rollout_id, call.issued_at)  # forgotten while held: restored again
            rollout = self.rollouts.open(call.rollout_id)  # it may have been sealed while the call was held
            seq = self.rollouts.begin_call(rollout)
            attempt = _Attempt(call=named(seeded(call, seq), seq), rollout=rollout, seq=seq,
                               call_id=f"call-{uuid.uuid4().hex}", received=received, held_s=held_s)
            try:
                async with contextlib.aclosing(self._serve(attempt, stream)) as items:
                    async for item in items:
                        yield item
            except Exception as exc:
                # Whatever went wrong is on the record, and the harness gets it in its own protocol.
                error = exc if isinstance(exc, GatewayError) else InternalError(f"the gateway failed: {exc!r}")
                self.metrics.errors.labels(call.api, str(error.status)).inc()
                rollout.unacknowledged.update(c for c in attempt.pending if c not in attempt.acknowledged)
                attempt.acknowledged = await self._record_failure(attempt, error)
                if error is exc:
                    raise
                raise error from exc
            finally:
                if attempt.rendered is not None:
                    attempt.rendered.release()
                self.rollouts.end_call(rollout, attempt.acknowledged)
                self.metrics.latency.labels(call.api).observe(time.perf_counter() - started)

    async def _serve(self, attempt: _Attempt, stream: bool) -> AsyncGenerator[Started | Delta | Finished]:
        """Render, generate, parse, record: the call's way when nothing fails."""
        call, rollout = attempt.call, attempt.rollout
        attempt.prompt, packed_prompt = self._render(rollout, call.chat)
        attempt.rendered = rollout.rendered
        prompt = attempt.prompt
        attempt.recorded = extension(rollout.tips, prompt, call.request_json, packed_prompt)
        yield Started(len(prompt), attempt.call_id)
        engine_started = time.perf_counter()
        state = Choices(call.chat.sampling.n, self.parser.start_marker, self.renderer.token_text)
        version = self.version
        async for chunk in self._generate(rollout, prompt, call.chat, stream):
            reported = chunk.get("weight_version")  # our engine says which weights; vLLM does not
            version = int(reported) if reported is not None else version
            for delta in state.add(chunk):
                yield delta
        engine_ms = (time.perf_counter() - engine_started) * 1000
        generations = state.finish(self.parser, call.chat)
        if call.chat.sampling.seed is not None:  # a seeded call: the ids of its tool calls as repeatable as its tokens
            generations = [seeded_tool_calls(g, call.chat.sampling.seed, attempt.seq) for g in generations]
        for delta in state.rest(generations):  # text held back for a tool call that did not parse
            yield delta
        usage = TokenUsage(prompt_tokens=len(prompt), completion_tokens=sum(len(g.token_ids) for g in generations))
        body = _dumps(call.respond(generations, usage, version).model_dump())
        outcome = _Outcome(weight_version=version, response_json=body.decode(), engine_ms=engine_ms)
        records = [self._event(attempt, outcome, g, f"{attempt.call_id}-{g.index}") for g in generations]
        attempt.pending = [r.call_id for r in records]
        await self._record(records)
        attempt.acknowledged = [r.call_id for r in records]
        if call.keep_as is not None:
            rollout.answers[call.keep_as] = (call.request_json, outcome.response_json)
        for g, record in zip(generations, records, strict=True):
            self.rollouts.remember_turn(rollout, message_key(g.content, g.tool_calls), g.token_ids)
            self.rollouts.remember_tip(rollout, tip(record.call_id, packed_prompt, g.token_ids, call.request_json))
        self.metrics.tokens.labels("prompt").inc(usage.prompt_tokens)
        self.metrics.tokens.labels("completion").inc(usage.completion_tokens)
        yield Finished(generations=generations, usage=usage, weight_version=version, body=body,
                       call_id=attempt.call_id)

    async def answer(self, rollout_id: str, answer_id: str, issued_at: float | None = None) -> tuple[str, str] | None:
        """A kept answer of the rollout, (request, response) as recorded, whichever replica served it."""
        rollout = await self.rollout(rollout_id, issued_at)
        return rollout.answers.get(answer_id)

    async def count_tokens(self, rollout_id: str, chat: ChatRequest, issued_at: float | None = None) -> int:
        """The prompt a call would send now (own turns reused), counted with the model's template and tokenizer."""
        rollout = await self.rollout(rollout_id, issued_at)
        return len(self.renderer.render(chat, own_turns(chat, rollout.turns)).prompt_ids)

    def _render(self, rollout: Rollout, chat: ChatRequest) -> tuple[list[int], bytes]:
        """The prompt's ids, and packed."""
        if chat.raw_prompt is not None:
            ids = self.renderer.encode(chat.raw_prompt)
            return ids, packed(ids)
        after = rollout.rendered if self.resume_rendering else None
        generated = own_turns(chat, rollout.turns, after)
        rendered = self.renderer.render(chat, generated, after)
        self._renders += 1
        self.metrics.resumed_renders.inc(rendered.resumed)
        if self.render_check_every and self._renders % self.render_check_every == 0:
            whole = differs(self.renderer, chat, generated, rendered)
            if whole is not None:
                self.metrics.render_mismatches.inc()
                log.error("rollout %s: the prompt rendered %s differs from the whole rendering (%d and %d ids); "
                          "the whole one is used", rollout.rollout_id,
                          "from its previous call" if rendered.resumed else "from remembered pieces",
                          len(rendered.prompt_ids), len(whole.prompt_ids))
                rendered = whole
        rollout.rendered = rendered.state if self.resume_rendering else None
        self.metrics.reused_turns.inc(rendered.reused_turns)
        return rendered.prompt_ids, rendered.packed

    async def _generate(self, rollout: Rollout, prompt: list[int], chat: ChatRequest, stream: bool
                        ) -> AsyncIterator[dict[str, Any]]:
        s = chat.sampling
        body: dict[str, Any] = {
            **model_fields(self.engine_kind, self.model, self.adapter), "prompt": prompt,
            "max_tokens": s.max_tokens, "temperature": s.temperature,
            "top_p": s.top_p, "seed": s.seed, "stop": list(s.stop) or None, "n": s.n,
            "logprobs": s.top_logprobs, **token_fields(self.engine_kind),
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

    async def _record_failure(self, attempt: _Attempt, exc: GatewayError) -> list[str]:
        """The failed call is on the record too; if even that cannot be stored, the harness learns of it."""
        body = exc.openai_body() if attempt.call.api.startswith("openai") else exc.anthropic_body()
        outcome = _Outcome(weight_version=self.version, response_json=orjson.dumps(body).decode(), error=exc)
        # Its own id: after a delivery timeout the success event may still land under "{call_id}-0".
        record = self._event(attempt, outcome, Generation.failed(), f"{attempt.call_id}-error")
        try:
            await self._record([record])
        except GatewayError:
            attempt.rollout.unacknowledged.add(record.call_id)  # it may land later: never part of the rollout
            return []
        return [record.call_id]

    def _event(self, attempt: _Attempt, outcome: _Outcome, g: Generation, call_id: str) -> events.ModelCall:
        call, rollout, s, error = attempt.call, attempt.rollout, attempt.call.chat.sampling, outcome.error
        recorded = attempt.recorded or Extension(None, attempt.prompt, 0, 0, call.request_json)
        return events.ModelCall(
            call_id=call_id, rollout_id=rollout.rollout_id, run_id=rollout.run_id, gateway_id=self.gateway_id,
            seq=attempt.seq, choice_index=g.index, api=call.api, model=self.model, request_json=recorded.request,
            extends=recorded.extends, request_head=recorded.request_head, request_tail=recorded.request_tail,
            response_json=outcome.response_json, prompt_token_ids=recorded.prompt, response_token_ids=g.token_ids,
            response_logprobs=g.logprobs, weight_version=outcome.weight_version,
            sampling=events.Sampling(temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_tokens or 0,
                                     seed=s.seed),
            usage=events.Usage(prompt_tokens=len(attempt.prompt), completion_tokens=len(g.token_ids)),
            timings=events.Timings(received_at=attempt.received, finished_at=datetime.now(UTC),
                                   queued_ms=attempt.held_s * 1000, engine_ms=outcome.engine_ms),
            status="ok" if error is None else "error", http_status=200 if error is None else error.status,
            finish_reason=g.finish_reason if error is None else None,
            error=error.message if error is not None else None,
            turn_key=message_key(g.content, g.tool_calls) if error is None else None,
        )


def seeded(call: Call, seq: int) -> Call:
    """The call with the sampling seed it will be recorded with: the harness's own, else the one drawn from the
    rollout's seed and the call's number (`schemas.seeds`), else none."""
    if call.seed is None or call.chat.sampling.seed is not None:
        return call
    chat = replace(call.chat, sampling=replace(call.chat.sampling, seed=call_seed(call.seed, seq)))
    return replace(call, chat=chat)


def named(call: Call, seq: int) -> Call:
    """A seeded call's answer named from its seed and number instead of at random: a harness sends the id back
    (Responses' `previous_response_id`), so a random one would make a rerun's next request differ."""
    seed = call.chat.sampling.seed
    if seed is None or call.rename is None:
        return call
    answer_id = call.rename(seeded_name(seed, seq, "response"))
    return replace(call, keep_as=answer_id) if call.keep_as is not None else call


def _dumps(value: Any) -> bytes:
    """orjson, or the stdlib for what only it writes: integers past 64 bits, which an answer can echo from the
    request (the Responses API returns its tools and metadata as sent)."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value).encode()
