"""Anthropic's messages API: what a harness sends, and the message it gets back."""

from __future__ import annotations

import json
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

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


#: Anthropic's effort levels: how hard Claude should think, which a local model has no knob for.
Effort = Literal["low", "medium", "high", "xhigh", "max"]


class SystemOutputConfig(BaseModel):
    """A system turn's own output options (Claude Code sends `{"effort": ...}` on its environment turn).

    Accepted and recorded; a local model ignores effort. `format` stays top-level only, as Anthropic's API has it."""

    model_config = ConfigDict(extra="forbid")
    effort: Effort | None = None


def _schema_by_role(schema: dict[str, Any]) -> None:
    """A turn's JSON schema as its shapes by role, which the validators check: content and nothing else on user
    and assistant turns; a system turn's options, with content or alone (the Anthropic SDK's three message types)."""
    fields = schema.pop("properties")
    content, config, clear_at = _given(fields["content"]), fields["output_config"], fields["clear_at"]

    def shape(role: dict[str, Any], required: list[str], **properties: Any) -> dict[str, Any]:
        return {"type": "object", "additionalProperties": False, "required": ["role", *required],
                "properties": {"role": {"type": "string", **role}, **properties}}

    schema.pop("required", None)
    schema.pop("type", None)
    system = {"const": "system"}
    schema["anyOf"] = [shape({"enum": ["user", "assistant"]}, ["content"], content=content),
                       shape(system, ["content"], content=content, output_config=config, clear_at=clear_at),
                       shape(system, ["output_config"], output_config=_given(config), clear_at=clear_at)]


def _given(field: dict[str, Any]) -> dict[str, Any]:
    """A field's schema without its null and default: for a shape in which it must be given."""
    kept = {k: v for k, v in field.items() if k != "default"}
    return {**kept, "anyOf": [b for b in field["anyOf"] if b.get("type") != "null"]}


class MessageParam(BaseModel):
    """One turn. A system turn (Claude Code sends them mid-conversation) may carry output options, may be shown
    only until the next user turn (`clear_at`), and may be options alone, without content."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_schema_by_role)
    role: Literal["user", "assistant", "system"]
    content: str | list[Block] | None = Field(None, validate_default=True)
    output_config: SystemOutputConfig | None = None
    clear_at: Literal["next_user_message", "never"] | None = None

    @field_validator("content")
    @classmethod
    def _content_required(cls, content: str | list[Block] | None, info: ValidationInfo) -> str | list[Block] | None:
        """Only a system turn may leave content out (it then carries options), as Anthropic's API allows."""
        if content is None and info.data.get("role", "system") != "system":
            raise PydanticCustomError("missing", "Field required")
        return content

    @field_validator("output_config", "clear_at")
    @classmethod
    def _system_only(cls, value: Any, info: ValidationInfo) -> Any:
        if info.data.get("role", "system") != "system":
            raise PydanticCustomError("system_only", 'only permitted on role "system" messages')
        return value

    @model_validator(mode="after")
    def _not_empty(self) -> MessageParam:
        if self.content is None and not (self.output_config and self.output_config.model_fields_set):
            raise PydanticCustomError("empty_message", "a system message needs content or output_config fields")
        return self


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
        last_user = max((i for i, m in enumerate(self.messages) if m.role == "user"), default=-1)
        for i, m in enumerate(self.messages):
            if m.clear_at == "next_user_message" and i < last_user:
                continue  # shown only until a user turn follows it; it stays in the request and the record
            messages += _turn(m)
        if not messages:
            raise InvalidRequest("messages: no turn has content and there is no system prompt: nothing to answer",
                                 "messages")
        if (orphan := chat.unanswered_result(messages)) is not None:  # Anthropic's words, as its API refuses it
            raise InvalidRequest(f"messages: unexpected `tool_use_id` found in `tool_result` blocks: {orphan[1]}. "
                                 "Each `tool_result` block must have a corresponding `tool_use` block in an earlier "
                                 "assistant message.", "messages")
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
    if m.content is None:  # a system turn of options alone: nothing for the model to read
        return []
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
