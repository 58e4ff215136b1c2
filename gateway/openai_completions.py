"""OpenAI `POST /v1/completions` (plain text in, text out): the same path as chat, without a chat template."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gateway.chat import ChatRequest, Generation, SamplingRequest
from gateway.errors import GatewayError, InvalidRequest
from gateway.service import Delta, Finished, Started


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


class CompletionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str
    prompt: str | list[str]
    max_tokens: int | None = Field(16, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    n: int = Field(1, ge=1, le=16)
    stop: str | list[str] | None = None
    seed: int | None = None
    logprobs: int | None = Field(None, ge=0, le=5)
    echo: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None

    def to_chat(self) -> ChatRequest:
        if self.echo:
            raise InvalidRequest("echo is not supported", "echo")
        prompt = self.prompt
        if isinstance(prompt, list):
            if len(prompt) != 1:
                raise InvalidRequest("send one prompt per request", "prompt")
            prompt = prompt[0]
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        return ChatRequest((), raw_prompt=prompt, sampling=SamplingRequest(
            max_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p, seed=self.seed, stop=stop,
            n=self.n, top_logprobs=self.logprobs or 0))


class Responder:
    def __init__(self, request: CompletionRequest, decode: Callable[[int], str]) -> None:
        self.request = request
        self.decode = decode
        self.id = f"cmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def _logprobs(self, g: Generation) -> dict[str, Any] | None:
        if self.request.logprobs is None:
            return None
        return {"tokens": [self.decode(t) for t in g.token_ids], "token_logprobs": g.logprobs,
                "top_logprobs": g.top_logprobs, "text_offset": []}

    def body(self, generations: list[Generation], usage: dict[str, int], version: int) -> dict[str, Any]:
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.request.model,
                "choices": [{"index": g.index, "text": g.text, "logprobs": self._logprobs(g),
                             "finish_reason": g.finish_reason} for g in generations],
                "usage": {**usage, "total_tokens": usage["prompt_tokens"] + usage["completion_tokens"]}}

    async def sse(self, items: AsyncIterator[Started | Delta | Finished]) -> AsyncIterator[str]:
        def chunk(choices: list[dict[str, Any]], **extra: Any) -> str:
            return "data: " + json.dumps({"id": self.id, "object": "text_completion", "created": self.created,
                                          "model": self.request.model, "choices": choices, **extra}) + "\n\n"

        try:
            async for item in items:
                if isinstance(item, Delta):
                    yield chunk([{"index": item.index, "text": item.text, "logprobs": None, "finish_reason": None}])
                elif isinstance(item, Finished):
                    for g in item.generations:
                        yield chunk([{"index": g.index, "text": "", "logprobs": self._logprobs(g),
                                      "finish_reason": g.finish_reason}])
                    if self.request.stream_options is not None and self.request.stream_options.include_usage:
                        u = item.usage
                        yield chunk([], usage={**u, "total_tokens": u["prompt_tokens"] + u["completion_tokens"]})
                    yield "data: [DONE]\n\n"
        except GatewayError as exc:
            yield f"data: {json.dumps(exc.openai_body())}\n\n"
