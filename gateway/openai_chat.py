"""OpenAI `POST /v1/chat/completions`: request → ChatRequest, generations → body or SSE chunks."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gateway.chat import ChatRequest, Generation, Message, SamplingRequest, ToolCall
from gateway.errors import GatewayError, InvalidRequest
from gateway.service import Delta, Finished, Started

Decode = Callable[[int], str]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FunctionCall(_Strict):
    name: str
    arguments: str


class ToolCallIn(_Strict):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")  # clients echo back fields such as refusal or annotations
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            other = [p.type for p in self.content if p.type != "text"]
            if other:
                raise InvalidRequest(f"content parts of type {other[0]!r} are not supported", "messages")
            return "".join(p.text or "" for p in self.content)
        return self.content or ""


class StreamOptions(_Strict):
    include_usage: bool = False


class ChatCompletionRequest(_Strict):
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=16)
    stop: str | list[str] | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    user: str | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    service_tier: str | None = None

    def to_chat(self) -> ChatRequest:
        if self.frequency_penalty or self.presence_penalty:
            raise InvalidRequest("frequency_penalty and presence_penalty are not supported", "frequency_penalty")
        for tool in self.tools or []:
            if tool.get("type") != "function" or not isinstance(tool.get("function"), dict) \
                    or not tool["function"].get("name"):
                raise InvalidRequest("each tool must be {'type': 'function', 'function': {'name': ...}}", "tools")
        messages = []
        for m in self.messages:
            role = "system" if m.role == "developer" else m.role
            calls = tuple(ToolCall(c.id, c.function.name, c.function.arguments) for c in m.tool_calls or [])
            if role == "tool" and not m.tool_call_id:
                raise InvalidRequest("a tool message needs tool_call_id", "messages")
            messages.append(Message(role, m.text(), calls, m.tool_call_id))
        choice = self.tool_choice if isinstance(self.tool_choice, str) else "auto"
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        return ChatRequest(
            tuple(messages), tuple(self.tools or ()), choice,
            SamplingRequest(max_tokens=self.max_completion_tokens or self.max_tokens, temperature=self.temperature,
                            top_p=self.top_p, seed=self.seed, stop=stop, n=self.n,
                            top_logprobs=(self.top_logprobs or 0) if self.logprobs else 0),
        )


def _message(g: Generation) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": g.content if (g.content or not g.tool_calls) else None}
    if g.tool_calls:
        message["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.name, "arguments": c.arguments}} for c in g.tool_calls]
    return message


def _logprobs(g: Generation, decode: Decode) -> dict[str, Any]:
    content = []
    for i, (token, lp) in enumerate(zip(g.token_ids, g.logprobs, strict=False)):
        text = decode(token)
        tops = g.top_logprobs[i] if i < len(g.top_logprobs) else {}
        content.append({"token": text, "logprob": lp, "bytes": list(text.encode()),
                        "top_logprobs": [{"token": t, "logprob": v, "bytes": list(t.encode())}
                                         for t, v in tops.items()]})
    return {"content": content, "refusal": None}


class Responder:
    def __init__(self, request: ChatCompletionRequest, decode: Decode) -> None:
        self.request = request
        self.decode = decode
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def body(self, generations: list[Generation], usage: dict[str, int], version: int) -> dict[str, Any]:
        return {
            "id": self.id, "object": "chat.completion", "created": self.created, "model": self.request.model,
            "choices": [{"index": g.index, "message": _message(g), "finish_reason": g.finish_reason,
                         "logprobs": _logprobs(g, self.decode) if self.request.logprobs else None}
                        for g in generations],
            "usage": {**usage, "total_tokens": usage["prompt_tokens"] + usage["completion_tokens"]},
            "system_fingerprint": f"tether-v{version}",
        }

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> str:
        body = {"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                "model": self.request.model, "system_fingerprint": None, "choices": choices, **extra}
        return f"data: {json.dumps(body)}\n\n"

    async def sse(self, items: AsyncIterator[Started | Delta | Finished]) -> AsyncIterator[str]:
        """OpenAI's chunk sequence; the finishing chunks leave only once the call is recorded."""
        started: set[int] = set()
        try:
            async for item in items:
                if isinstance(item, Started):
                    continue
                if isinstance(item, Delta):
                    delta: dict[str, Any] = {"content": item.text}
                    if item.index not in started:
                        started.add(item.index)
                        delta["role"] = "assistant"
                    yield self._chunk([{"index": item.index, "delta": delta, "logprobs": None,
                                        "finish_reason": None}])
                    continue
                for g in item.generations:
                    if g.index not in started:
                        yield self._chunk([{"index": g.index, "delta": {"role": "assistant", "content": ""},
                                            "logprobs": None, "finish_reason": None}])
                    if g.tool_calls:
                        calls = [{"index": k, "id": c.id, "type": "function",
                                  "function": {"name": c.name, "arguments": c.arguments}}
                                 for k, c in enumerate(g.tool_calls)]
                        yield self._chunk([{"index": g.index, "delta": {"tool_calls": calls}, "logprobs": None,
                                            "finish_reason": None}])
                    logprobs = _logprobs(g, self.decode) if self.request.logprobs else None
                    yield self._chunk([{"index": g.index, "delta": {}, "logprobs": logprobs,
                                        "finish_reason": g.finish_reason}])
                options = self.request.stream_options
                if options is not None and options.include_usage:
                    u = item.usage
                    yield self._chunk([], usage={**u, "total_tokens": u["prompt_tokens"] + u["completion_tokens"]})
                yield "data: [DONE]\n\n"
        except GatewayError as exc:
            yield f"data: {json.dumps(exc.openai_body())}\n\n"
