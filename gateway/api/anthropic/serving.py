"""Anthropic `POST /v1/messages`: generations → a message or Anthropic's event stream."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

from gateway.api.anthropic.protocol import Message, MessagesRequest, TextBlock, ToolUseBlock, Usage
from gateway.chat import Finished, Generation, Started, TokenUsage
from gateway.choices import Delta
from gateway.errors import GatewayError

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def _content(g: Generation) -> list[TextBlock | ToolUseBlock]:
    blocks: list[TextBlock | ToolUseBlock] = [TextBlock(text=g.content)] if g.content or not g.tool_calls else []
    for c in g.tool_calls:
        blocks.append(ToolUseBlock(id=_tool_id(c.id), name=c.name, input=json.loads(c.arguments)))
    return blocks


def _tool_id(call_id: str) -> str:
    return call_id if call_id.startswith("toolu_") else "toolu_" + call_id.removeprefix("call_")


def _event(kind: str, data: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n"


class Responder:
    def __init__(self, request: MessagesRequest) -> None:
        self.request = request
        self.id = f"msg_{uuid.uuid4().hex[:24]}"

    def rename(self, name: str) -> str:
        self.id = f"msg_{name[:24]}"
        return self.id

    def _stop(self, g: Generation) -> tuple[str, str | None]:
        hit = g.stop_reason if isinstance(g.stop_reason, str) and g.stop_reason in (self.request.stop_sequences or [])\
            else None
        return ("stop_sequence", hit) if hit else (STOP_REASONS.get(g.finish_reason, "end_turn"), None)

    def body(self, generations: list[Generation], usage: TokenUsage, version: int) -> Message:
        (g,) = generations
        reason, sequence = self._stop(g)
        return Message(id=self.id, model=self.request.model, content=_content(g), stop_reason=reason,
                       stop_sequence=sequence, usage=Usage.of(usage))

    def _start(self, prompt_tokens: int) -> str:
        """message_start: the message as it will be, before any content."""
        message = Message(id=self.id, model=self.request.model, content=[], stop_reason=None, stop_sequence=None,
                          usage=Usage(input_tokens=prompt_tokens, output_tokens=0))
        return _event("message_start", {"message": message.model_dump()})

    def _finish(self, item: Finished, text_open: bool) -> list[str]:
        """The text block closed, each tool call as a whole block, then message_delta and message_stop."""
        (g,) = item.generations
        events, index = [], 0
        if text_open or not g.tool_calls:
            if not text_open:
                events.append(_event("content_block_start", {"index": 0, "content_block": {"type": "text",
                                                                                           "text": ""}}))
            events.append(_event("content_block_stop", {"index": 0}))
            index = 1
        for k, c in enumerate(g.tool_calls):
            events += [
                _event("content_block_start", {"index": index + k, "content_block": {
                    "type": "tool_use", "id": _tool_id(c.id), "name": c.name, "input": {}}}),
                _event("content_block_delta", {"index": index + k, "delta": {
                    "type": "input_json_delta", "partial_json": c.arguments}}),
                _event("content_block_stop", {"index": index + k}),
            ]
        reason, sequence = self._stop(g)
        events.append(_event("message_delta", {"delta": {"stop_reason": reason, "stop_sequence": sequence},
                                               "usage": {"output_tokens": item.usage.completion_tokens}}))
        events.append(_event("message_stop", {}))
        return events

    async def sse(self, items: AsyncIterator[Started | Delta | Finished]) -> AsyncIterator[str]:
        """message_start, content blocks, message_delta, message_stop; the last two wait for the record."""
        text_open = False
        try:
            async for item in items:
                if isinstance(item, Started):
                    yield self._start(item.prompt_tokens)
                elif isinstance(item, Delta):
                    if not text_open:
                        yield _event("content_block_start", {"index": 0, "content_block": {"type": "text",
                                                                                           "text": ""}})
                        text_open = True
                    yield _event("content_block_delta", {"index": 0, "delta": {"type": "text_delta",
                                                                               "text": item.text}})
                else:
                    for event in self._finish(item, text_open):
                        yield event
        except GatewayError as exc:
            yield f"event: error\ndata: {json.dumps(exc.anthropic_body())}\n\n"
