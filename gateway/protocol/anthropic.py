"""Anthropic's messages API: what a harness sends, and the message it gets back."""

from __future__ import annotations

import json
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gateway import chat
from gateway.errors import InvalidRequest

# -- requests ------------------------------------------------------------------


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


class MessageParam(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["user", "assistant"]
    content: str | list[Block]


class Tool(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str
    description: str | None = None
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})


class ToolChoice(BaseModel):
    model_config = ConfigDict(extra="ignore")  # disable_parallel_tool_use: one call per turn is what we parse anyway
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None


class MessagesRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str
    max_tokens: int = Field(ge=1, le=chat.MAX_TOKENS)
    messages: list[MessageParam] = Field(min_length=1)
    system: str | list[Block] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float = Field(1.0, ge=0.0, le=1.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = None
    metadata: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    service_tier: str | None = None

    def to_chat(self) -> chat.ChatRequest:
        messages: list[chat.Message] = []
        if self.system:
            system = self.system if isinstance(self.system, str) else "".join(b.text or "" for b in self.system)
            messages.append(chat.Message("system", system))
        for m in self.messages:
            messages += _turn(m)
        tools = tuple({"type": "function", "function": {"name": t.name, "description": t.description or "",
                                                       "parameters": t.input_schema}} for t in self.tools or [])
        choice = {"none": "none", "any": "required", "tool": "required"}.get(
            self.tool_choice.type if self.tool_choice else "auto", "auto")
        return chat.ChatRequest(tuple(messages), tools=tools, tool_choice=choice, sampling=chat.SamplingRequest(
            max_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p or 1.0,
            stop=tuple(self.stop_sequences or ()),
        ))


def _turn(m: MessageParam) -> list[chat.Message]:
    """One Anthropic turn as chat messages: tool results become tool messages, as OpenAI's shape has them."""
    blocks = [Block(type="text", text=m.content)] if isinstance(m.content, str) else m.content
    if m.role == "assistant":
        text = "".join(b.text or "" for b in blocks if b.type == "text")
        calls = tuple(chat.ToolCall(b.id or f"toolu_{uuid.uuid4().hex[:24]}", b.name or "",
                                    json.dumps(b.input or {})) for b in blocks if b.type == "tool_use")
        return [chat.Message("assistant", text, calls)]
    for b in blocks:
        if b.type not in ("text", "tool_result"):
            raise InvalidRequest(f"content blocks of type {b.type!r} are not supported", "messages")
    messages = [chat.Message("tool", b.plain(), tool_call_id=b.tool_use_id) for b in blocks if b.type == "tool_result"]
    text = "".join(b.text or "" for b in blocks if b.type == "text")
    if text or not any(b.type == "tool_result" for b in blocks):
        messages.append(chat.Message("user", text))
    return messages


# -- responses -----------------------------------------------------------------


class TextBlock(BaseModel):
    type: Literal["text"] = "text"
    text: str


class ToolUseBlock(BaseModel):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


class Usage(BaseModel):
    input_tokens: int
    output_tokens: int

    @classmethod
    def of(cls, usage: chat.TokenUsage) -> Usage:
        return cls(input_tokens=usage.prompt_tokens, output_tokens=usage.completion_tokens)


class Message(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[TextBlock | ToolUseBlock]
    stop_reason: str | None
    stop_sequence: str | None
    usage: Usage
