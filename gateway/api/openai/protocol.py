"""OpenAI's chat completions and completions: what a harness sends, and what it gets back."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gateway import chat
from gateway.errors import InvalidRequest


class _Strict(BaseModel):
    """Unknown fields are refused: silently ignoring a sampling option would change the rollout unseen."""

    model_config = ConfigDict(extra="forbid")


# -- requests ------------------------------------------------------------------


class FunctionCall(_Strict):
    name: str
    arguments: str  # JSON text


class FunctionToolCall(_Strict):
    """A tool call as an assistant message carries it, both ways."""

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
    tool_calls: list[FunctionToolCall] | None = None
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


def _stop(stop: str | list[str] | None) -> tuple[str, ...]:
    return (stop,) if isinstance(stop, str) else tuple(stop or ())


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
    max_tokens: int | None = Field(None, ge=1, le=chat.MAX_TOKENS)
    max_completion_tokens: int | None = Field(None, ge=1, le=chat.MAX_TOKENS)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=chat.SEED_MIN, le=chat.SEED_MAX)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    user: str | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    service_tier: str | None = None

    def to_chat(self) -> chat.ChatRequest:
        if self.frequency_penalty or self.presence_penalty:
            raise InvalidRequest("frequency_penalty and presence_penalty are not supported", "frequency_penalty")
        for tool in self.tools or []:
            if tool.get("type") != "function" or not isinstance(tool.get("function"), dict) \
                    or not tool["function"].get("name"):
                raise InvalidRequest("each tool must be {'type': 'function', 'function': {'name': ...}}", "tools")
        messages = []
        for m in self.messages:
            role = "system" if m.role == "developer" else m.role
            calls = tuple(chat.ToolCall(c.id, c.function.name, c.function.arguments) for c in m.tool_calls or [])
            if role == "tool" and not m.tool_call_id:
                raise InvalidRequest("a tool message needs tool_call_id", "messages")
            messages.append(chat.Message(role, m.text(), calls, m.tool_call_id))
        if (orphan := chat.unanswered_result(messages)) is not None:
            raise InvalidRequest(f"messages.{orphan[0]}: tool_call_id {orphan[1]!r} answers no tool call of an "
                                 "earlier assistant message", f"messages.{orphan[0]}.tool_call_id")
        choice = self.tool_choice if isinstance(self.tool_choice, str) else "auto"
        return chat.ChatRequest(
            tuple(messages), tools=tuple(self.tools or ()), tool_choice=choice,
            sampling=chat.SamplingRequest(max_tokens=self.max_completion_tokens or self.max_tokens,
                                          temperature=self.temperature, top_p=self.top_p, seed=self.seed,
                                          stop=_stop(self.stop), n=self.n,
                                          top_logprobs=(self.top_logprobs or 0) if self.logprobs else 0),
        )


class CompletionRequest(_Strict):
    model: str
    prompt: str | list[str]
    max_tokens: int | None = Field(16, ge=1, le=chat.MAX_TOKENS)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    n: int = Field(1, ge=1, le=16)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=chat.SEED_MIN, le=chat.SEED_MAX)
    logprobs: int | None = Field(None, ge=0, le=5)
    echo: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None

    def to_chat(self) -> chat.ChatRequest:
        if self.echo:
            raise InvalidRequest("echo is not supported", "echo")
        prompt = self.prompt
        if isinstance(prompt, list):
            if len(prompt) != 1:
                raise InvalidRequest("send one prompt per request", "prompt")
            prompt = prompt[0]
        return chat.ChatRequest((), raw_prompt=prompt, sampling=chat.SamplingRequest(
            max_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p, seed=self.seed,
            stop=_stop(self.stop), n=self.n, top_logprobs=self.logprobs or 0))


# -- responses -----------------------------------------------------------------


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, usage: chat.TokenUsage) -> Usage:
        return cls(prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens,
                   total_tokens=usage.total_tokens)


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob]
    refusal: None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    #: left out of the body, not sent as null, when the model called no tool
    tool_calls: list[FunctionToolCall] | None = Field(None, exclude_if=lambda calls: calls is None)


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: str
    logprobs: ChoiceLogprobs | None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: str


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
