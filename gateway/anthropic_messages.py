"""Anthropic `POST /v1/messages`: request → ChatRequest, generations → message or Anthropic's event stream."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gateway.chat import ChatRequest, Generation, Message, SamplingRequest, ToolCall
from gateway.errors import GatewayError, InvalidRequest
from gateway.service import Delta, Finished, Started

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


class Block(BaseModel):
    model_config = ConfigDict(extra="ignore")  # cache_control, citations... carry no meaning here
    type: str
    text: str | None = None
    id: str | None = None
    name: str | None = None
    input: dict[str, Any] | None = None
    tool_use_id: str | None = None
    content: str | list[Block] | None = None
    is_error: bool | None = None

    def plain(self) -> str:
        if isinstance(self.content, list):
            return "".join(b.text or "" for b in self.content if b.type == "text")
        return self.content or ""


class AnthropicMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["user", "assistant"]
    content: str | list[Block]


class Tool(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str
    description: str | None = None
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})


class MessagesRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str
    max_tokens: int = Field(ge=1)
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: str | list[Block] | None = None
    tools: list[Tool] | None = None
    tool_choice: dict[str, Any] | None = None
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float = Field(1.0, ge=0.0, le=1.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = None
    metadata: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    service_tier: str | None = None

    def to_chat(self) -> ChatRequest:
        messages: list[Message] = []
        if self.system:
            system = self.system if isinstance(self.system, str) else "".join(b.text or "" for b in self.system)
            messages.append(Message("system", system))
        for m in self.messages:
            blocks = [Block(type="text", text=m.content)] if isinstance(m.content, str) else m.content
            if m.role == "assistant":
                text = "".join(b.text or "" for b in blocks if b.type == "text")
                calls = tuple(ToolCall(b.id or f"toolu_{uuid.uuid4().hex[:24]}", b.name or "",
                                       json.dumps(b.input or {})) for b in blocks if b.type == "tool_use")
                messages.append(Message("assistant", text, calls))
                continue
            for b in blocks:
                if b.type not in ("text", "tool_result"):
                    raise InvalidRequest(f"content blocks of type {b.type!r} are not supported", "messages")
            messages += [Message("tool", b.plain(), tool_call_id=b.tool_use_id)
                         for b in blocks if b.type == "tool_result"]
            text = "".join(b.text or "" for b in blocks if b.type == "text")
            if text or not any(b.type == "tool_result" for b in blocks):
                messages.append(Message("user", text))
        tools = tuple({"type": "function", "function": {"name": t.name, "description": t.description or "",
                                                       "parameters": t.input_schema}} for t in self.tools or [])
        choice = {"none": "none", "any": "required", "tool": "required"}.get((self.tool_choice or {}).get("type", ""),
                                                                             "auto")
        return ChatRequest(tuple(messages), tools, choice, SamplingRequest(
            max_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p or 1.0,
            stop=tuple(self.stop_sequences or ()),
        ))


def _content(g: Generation) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = [{"type": "text", "text": g.content}] if g.content or not g.tool_calls else []
    for c in g.tool_calls:
        blocks.append({"type": "tool_use", "id": _tool_id(c.id), "name": c.name, "input": json.loads(c.arguments)})
    return blocks


def _tool_id(call_id: str) -> str:
    return call_id if call_id.startswith("toolu_") else "toolu_" + call_id.removeprefix("call_")


class Responder:
    def __init__(self, request: MessagesRequest) -> None:
        self.request = request
        self.id = f"msg_{uuid.uuid4().hex[:24]}"

    def _stop(self, g: Generation) -> tuple[str, str | None]:
        hit = g.stop_reason if isinstance(g.stop_reason, str) and g.stop_reason in (self.request.stop_sequences or [])\
            else None
        return ("stop_sequence", hit) if hit else (STOP_REASONS.get(g.finish_reason, "end_turn"), None)

    def body(self, generations: list[Generation], usage: dict[str, int], version: int) -> dict[str, Any]:
        (g,) = generations
        reason, sequence = self._stop(g)
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.request.model,
                "content": _content(g), "stop_reason": reason, "stop_sequence": sequence,
                "usage": {"input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"]}}

    async def sse(self, items: AsyncIterator[Started | Delta | Finished]) -> AsyncIterator[str]:
        """message_start, content blocks, message_delta, message_stop; the last two wait for the record."""
        def event(kind: str, data: dict[str, Any]) -> str:
            return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n"

        text_open = False
        try:
            async for item in items:
                if isinstance(item, Started):
                    yield event("message_start", {"message": {
                        "id": self.id, "type": "message", "role": "assistant", "model": self.request.model,
                        "content": [], "stop_reason": None, "stop_sequence": None,
                        "usage": {"input_tokens": item.prompt_tokens, "output_tokens": 0}}})
                    continue
                if isinstance(item, Delta):
                    if not text_open:
                        yield event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})
                        text_open = True
                    yield event("content_block_delta", {"index": 0, "delta": {"type": "text_delta",
                                                                              "text": item.text}})
                    continue
                (g,) = item.generations
                index = 0
                if text_open or not g.tool_calls:
                    if not text_open:
                        yield event("content_block_start", {"index": 0, "content_block": {"type": "text",
                                                                                          "text": ""}})
                    yield event("content_block_stop", {"index": 0})
                    index = 1
                for k, c in enumerate(g.tool_calls):
                    yield event("content_block_start", {"index": index + k, "content_block": {
                        "type": "tool_use", "id": _tool_id(c.id), "name": c.name, "input": {}}})
                    yield event("content_block_delta", {"index": index + k, "delta": {
                        "type": "input_json_delta", "partial_json": c.arguments}})
                    yield event("content_block_stop", {"index": index + k})
                reason, sequence = self._stop(g)
                yield event("message_delta", {"delta": {"stop_reason": reason, "stop_sequence": sequence},
                                              "usage": {"output_tokens": item.usage["completion_tokens"]}})
                yield event("message_stop", {})
        except GatewayError as exc:
            yield f"event: error\ndata: {json.dumps(exc.anthropic_body())}\n\n"
