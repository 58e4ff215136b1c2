"""OpenAI `POST /v1/chat/completions`: generations → a chat completion or OpenAI's chunk stream."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from gateway.api.openai.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChatCompletionRequest,
    ChoiceLogprobs,
    FunctionCall,
    FunctionToolCall,
    TokenLogprob,
    TopLogprob,
    Usage,
)
from gateway.chat import Finished, Generation, Started, TokenUsage
from gateway.choices import Delta
from gateway.errors import GatewayError

Decode = Callable[[int], str]


def _tool_calls(g: Generation) -> list[FunctionToolCall]:
    return [FunctionToolCall(id=c.id, function=FunctionCall(name=c.name, arguments=c.arguments))
            for c in g.tool_calls]


def _message(g: Generation) -> AssistantMessage:
    return AssistantMessage(content=g.content if (g.content or not g.tool_calls) else None,
                            tool_calls=_tool_calls(g) or None)


def _logprobs(g: Generation, decode: Decode) -> ChoiceLogprobs:
    content = []
    for i, (token, lp) in enumerate(zip(g.token_ids, g.logprobs, strict=False)):
        text = decode(token)
        tops = g.top_logprobs[i] if i < len(g.top_logprobs) else {}
        content.append(TokenLogprob(token=text, logprob=lp, bytes=list(text.encode()), top_logprobs=[
            TopLogprob(token=t, logprob=v, bytes=list(t.encode())) for t, v in tops.items()]))
    return ChoiceLogprobs(content=content)


class Responder:
    def __init__(self, request: ChatCompletionRequest, decode: Decode) -> None:
        self.request = request
        self.decode = decode
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def rename(self, name: str) -> str:
        self.id = f"chatcmpl-{name[:32]}"
        return self.id

    def _logprobs(self, g: Generation) -> ChoiceLogprobs | None:
        return _logprobs(g, self.decode) if self.request.logprobs else None

    def body(self, generations: list[Generation], usage: TokenUsage, version: int) -> ChatCompletion:
        return ChatCompletion(
            id=self.id, created=self.created, model=self.request.model,
            choices=[ChatChoice(index=g.index, message=_message(g), finish_reason=g.finish_reason,
                                logprobs=self._logprobs(g)) for g in generations],
            usage=Usage.of(usage), system_fingerprint=f"tether-v{version}",
        )

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> str:
        body = {"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                "model": self.request.model, "system_fingerprint": None, "choices": choices, **extra}
        return f"data: {json.dumps(body)}\n\n"

    def _choice(self, index: int, delta: dict[str, Any], logprobs: ChoiceLogprobs | None = None,
                finish_reason: str | None = None) -> str:
        return self._chunk([{"index": index, "delta": delta,
                             "logprobs": logprobs.model_dump() if logprobs is not None else None,
                             "finish_reason": finish_reason}])

    def _finish(self, g: Generation, started: bool) -> list[str]:
        """A choice's last chunks: its role if nothing was streamed, its tool calls whole, its finish reason."""
        chunks = [] if started else [self._choice(g.index, {"role": "assistant", "content": ""})]
        if g.tool_calls:
            calls = [{"index": k, **call.model_dump()} for k, call in enumerate(_tool_calls(g))]
            chunks.append(self._choice(g.index, {"tool_calls": calls}))
        chunks.append(self._choice(g.index, {}, self._logprobs(g), g.finish_reason))
        return chunks

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
                    yield self._choice(item.index, delta)
                    continue
                for g in item.generations:
                    for chunk in self._finish(g, g.index in started):
                        yield chunk
                options = self.request.stream_options
                if options is not None and options.include_usage:
                    yield self._chunk([], usage=Usage.of(item.usage).model_dump())
                yield "data: [DONE]\n\n"
        except GatewayError as exc:
            yield f"data: {json.dumps(exc.openai_body())}\n\n"
