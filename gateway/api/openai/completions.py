"""OpenAI `POST /v1/completions` (plain text in, text out): the same path as chat, without a chat template."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from gateway.api.openai.protocol import Completion, CompletionChoice, CompletionLogprobs, CompletionRequest, Usage
from gateway.chat import Finished, Generation, Started, TokenUsage
from gateway.choices import Delta
from gateway.errors import GatewayError


class Responder:
    def __init__(self, request: CompletionRequest, decode: Callable[[int], str]) -> None:
        self.request = request
        self.decode = decode
        self.id = f"cmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def rename(self, name: str) -> str:
        self.id = f"cmpl-{name[:32]}"
        return self.id

    def _logprobs(self, g: Generation) -> CompletionLogprobs | None:
        if self.request.logprobs is None:
            return None
        return CompletionLogprobs(tokens=[self.decode(t) for t in g.token_ids], token_logprobs=g.logprobs,
                                  top_logprobs=g.top_logprobs)

    def body(self, generations: list[Generation], usage: TokenUsage, version: int) -> Completion:
        return Completion(id=self.id, created=self.created, model=self.request.model, usage=Usage.of(usage),
                          choices=[CompletionChoice(index=g.index, text=g.text, logprobs=self._logprobs(g),
                                                    finish_reason=g.finish_reason) for g in generations])

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> str:
        return "data: " + json.dumps({"id": self.id, "object": "text_completion", "created": self.created,
                                      "model": self.request.model, "choices": choices, **extra}) + "\n\n"

    async def sse(self, items: AsyncIterator[Started | Delta | Finished]) -> AsyncIterator[str]:
        try:
            async for item in items:
                if isinstance(item, Delta):
                    yield self._chunk([{"index": item.index, "text": item.text, "logprobs": None,
                                        "finish_reason": None}])
                elif isinstance(item, Finished):
                    for g in item.generations:
                        logprobs = self._logprobs(g)
                        yield self._chunk([{"index": g.index, "text": "",
                                            "logprobs": logprobs.model_dump() if logprobs is not None else None,
                                            "finish_reason": g.finish_reason}])
                    if self.request.stream_options is not None and self.request.stream_options.include_usage:
                        yield self._chunk([], usage=Usage.of(item.usage).model_dump())
                    yield "data: [DONE]\n\n"
        except GatewayError as exc:
            yield f"data: {json.dumps(exc.openai_body())}\n\n"
