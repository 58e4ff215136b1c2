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
    model_config = ConfigDict(extra="ignore")  # cache_control, citations, signature... carry no meaning here
    type: str
    text: str | None = None
    id: str | None = None
    name: str | None = None
    input: dict[str, Any] | None = None
    tool_use_id: str | None = None
    content: str | list[Block] | None = None
    is_error: bool | None = None

    def plain(self) -> str:
        """A tool result's text; a result the model could not read (an image) is refused, not dropped."""
        if not isinstance(self.content, list):
            return self.content or ""
        for b in self.content:
            if b.type != "text":
                raise InvalidRequest(f"tool_result content of type {b.type!r} is not supported", "messages")
        return "".join(b.text or "" for b in self.content)


#: Earlier turns' reasoning: accepted and left out of the prompt, as Anthropic's API leaves it out for most models.
THINKING = ("thinking", "redacted_thinking")


class MessageParam(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["user", "assistant", "system"]  # Claude Code sends system turns mid-conversation
    content: str | list[Block]


class Tool(BaseModel):
    model_config = ConfigDict(extra="ignore")  # cache_control, eager_input_streaming...
    name: str
    type: str | None = None  # None or "custom": the harness runs it; else one of Anthropic's own
    description: str | None = None
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    defer_loading: bool = False  # tool search: not in the model's context until found

    def to_function(self) -> dict[str, Any]:
        if self.type not in (None, "custom"):
            raise InvalidRequest(f"tool {self.name!r} is Anthropic's built-in {self.type!r}, which a local model "
                                 "cannot run; define it as a custom tool (name, description, input_schema)", "tools")
        return {"type": "function", "function": {"name": self.name, "description": self.description or "",
                                                 "parameters": self.input_schema}}


class ToolChoice(BaseModel):
    model_config = ConfigDict(extra="ignore")  # disable_parallel_tool_use: one call per turn is what we parse anyway
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None


class Conversation(BaseModel):
    """What a messages request and a token count share: everything that becomes the prompt.

    Options that mean nothing for a local model (thinking budgets, context management, effort, caching,
    metadata) are accepted so that harnesses such as Claude Code work unchanged; they stay in the recorded
    request. Unknown fields are refused."""

    model_config = ConfigDict(extra="forbid")
    model: str
    messages: list[MessageParam] = Field(min_length=1)
    system: str | list[Block] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: dict[str, Any] | None = None
    context_management: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None
    cache_control: dict[str, Any] | None = None
    mcp_servers: list[dict[str, Any]] | None = None

    def sampling(self) -> chat.SamplingRequest:
        return chat.SamplingRequest()

    def to_chat(self) -> chat.ChatRequest:
        if self.mcp_servers:
            raise InvalidRequest("MCP servers run by the API are not supported; connect them in the harness",
                                 "mcp_servers")
        messages: list[chat.Message] = []
        if self.system:
            messages.append(chat.Message("system", _text(self.system, "system")))
        for m in self.messages:
            messages += _turn(m)
        tools = tuple(t.to_function() for t in self.tools or [] if not t.defer_loading)
        choice = {"none": "none", "any": "required", "tool": "required"}.get(
            self.tool_choice.type if self.tool_choice else "auto", "auto")
        return chat.ChatRequest(tuple(messages), tools=tools, tool_choice=choice, sampling=self.sampling())


class CountTokensRequest(Conversation):
    """`POST /v1/messages/count_tokens`: the prompt a messages request would make, counted, not generated."""


class MessagesRequest(Conversation):
    max_tokens: int = Field(ge=1, le=chat.MAX_TOKENS)
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float = Field(1.0, ge=0.0, le=1.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = None
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None

    def sampling(self) -> chat.SamplingRequest:
        return chat.SamplingRequest(max_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p or 1.0,
                                    stop=tuple(self.stop_sequences or ()))


def _text(content: str | list[Block], field: str) -> str:
    if isinstance(content, str):
        return content
    for b in content:
        if b.type != "text":
            raise InvalidRequest(f"{field} content blocks of type {b.type!r} are not supported", field)
    return "".join(b.text or "" for b in content)


def _turn(m: MessageParam) -> list[chat.Message]:
    """One Anthropic turn as chat messages: tool results become tool messages, as OpenAI's shape has them."""
    if m.role == "system":
        return [chat.Message("system", _text(m.content, "messages"))]
    blocks = [Block(type="text", text=m.content)] if isinstance(m.content, str) else m.content
    if m.role == "assistant":
        for b in blocks:
            if b.type not in ("text", "tool_use", *THINKING):
                raise InvalidRequest(f"assistant content blocks of type {b.type!r} are not supported", "messages")
        text = "".join(b.text or "" for b in blocks if b.type == "text")
        calls = tuple(chat.ToolCall(b.id or f"toolu_{uuid.uuid4().hex[:24]}", b.name or "",
                                    json.dumps(b.input or {})) for b in blocks if b.type == "tool_use")
        return [chat.Message("assistant", text, calls)]
    for b in blocks:
        if b.type not in ("text", "tool_result"):
            raise InvalidRequest(f"content blocks of type {b.type!r} are not supported", "messages")
    messages = [chat.Message("tool", _result(b), tool_call_id=b.tool_use_id) for b in blocks
                if b.type == "tool_result"]
    text = "".join(b.text or "" for b in blocks if b.type == "text")
    if text or not any(b.type == "tool_result" for b in blocks):
        messages.append(chat.Message("user", text))
    return messages


def _result(b: Block) -> str:
    """A tool result as the model reads it; a failed one says so, as Anthropic's own rendering marks it."""
    return f"Error: {b.plain()}" if b.is_error else b.plain()


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
