"""OpenAI's Responses API (what Codex speaks): input items in, output items out.

A request becomes the gateway's `ChatRequest`: `instructions` as the system
turn, then the conversation of `previous_response_id` (resolved by the caller),
then the input items: messages, and the function calls and outputs of a tool
loop, folded into assistant and tool turns as chat has them. Reasoning items a
client sends back are dropped: the model here writes none. Tools the gateway
cannot run (web search, file search, computer use...) are refused by name.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gateway import chat
from gateway.errors import InvalidRequest

#: The `api` of the calls this protocol records.
RESPONSES = "openai.responses"

#: Tools a model behind the gateway cannot use: the API would run them itself.
HOSTED_TOOLS = ("web_search", "web_search_preview", "file_search", "computer_use_preview", "code_interpreter",
                "image_generation", "mcp")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Part(BaseModel):
    model_config = ConfigDict(extra="ignore")  # annotations, logprobs echoed back
    type: str
    text: str | None = None


class Item(BaseModel):
    """One input item; which fields count depends on its type."""

    model_config = ConfigDict(extra="ignore")  # id, status, encrypted_content...
    type: str = "message"  # an easy input message may leave it out
    role: Literal["user", "assistant", "system", "developer"] | None = None
    content: str | list[Part] | None = None
    call_id: str | None = None
    name: str | None = None
    namespace: str | None = None
    arguments: str | None = None
    output: str | list[Part] | None = None


class ResponsesRequest(_Strict):
    model: str
    input: str | list[Item]
    instructions: str | None = None
    previous_response_id: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] = "auto"
    parallel_tool_calls: bool = True
    max_output_tokens: int | None = Field(None, ge=1, le=chat.MAX_TOKENS)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    store: bool = True
    stream: bool = False
    # Accepted so that clients such as Codex work unchanged; they mean nothing for the model here (recorded).
    reasoning: dict[str, Any] | None = None
    include: list[str] | None = None
    prompt_cache_key: str | None = None
    client_metadata: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    service_tier: str | None = None
    truncation: Literal["disabled", "auto"] | None = None
    text: dict[str, Any] | None = None
    stream_options: dict[str, Any] | None = None
    background: bool = False

    def functions(self) -> tuple[dict[str, Any], ...]:
        """Function tools in chat's shape; a namespace's functions are listed by their own names."""
        out: list[dict[str, Any]] = []
        for tool in self.tools or []:
            kind = tool.get("type")
            if kind == "namespace":
                out += [_function(t) for t in tool.get("tools") or []]
            elif kind == "function":
                out.append(_function(tool))
            else:
                hosted = " (a tool the API itself runs)" if kind in HOSTED_TOOLS else ""
                raise InvalidRequest(f"tools of type {kind!r}{hosted} are not supported: the model behind this "
                                     "gateway can only call function tools", "tools")
        return tuple(out)

    def namespaces(self) -> dict[str, str]:
        """Function name → its namespace, for the calls the model makes."""
        return {t["name"]: tool["name"] for tool in self.tools or [] if tool.get("type") == "namespace"
                for t in tool.get("tools") or [] if isinstance(t, dict) and "name" in t}

    def to_chat(self, earlier: tuple[chat.Message, ...] = ()) -> chat.ChatRequest:
        """The whole conversation; `earlier`: that of `previous_response_id`, its output included."""
        if self.background:
            raise InvalidRequest("background responses are not supported", "background")
        if self.text and (self.text.get("format") or {}).get("type", "text") != "text":
            raise InvalidRequest("only text output is supported (text.format.type 'text')", "text")
        tools = self.functions()
        system = (chat.Message("system", self.instructions),) if self.instructions else ()
        choice = self.tool_choice if isinstance(self.tool_choice, str) else "required"
        if choice not in ("auto", "none", "required"):
            raise InvalidRequest("tool_choice must be auto, none, required or a function", "tool_choice")
        conversation = (*earlier, *self.messages())
        if (orphan := chat.unanswered_result(conversation)) is not None:  # OpenAI's own words
            raise InvalidRequest(f"No tool call found for function call output with call_id {orphan[1]}.", "input")
        return chat.ChatRequest((*system, *conversation), tools=tools, tool_choice=choice,
                                sampling=chat.SamplingRequest(max_tokens=self.max_output_tokens,
                                                              temperature=self.temperature, top_p=self.top_p))

    def messages(self) -> tuple[chat.Message, ...]:
        """The input items as chat turns: an assistant message and the function calls after it are one turn."""
        if isinstance(self.input, str):
            return (chat.Message("user", self.input),)
        return fold_items(self.input)


def fold_items(items: list[Item]) -> tuple[chat.Message, ...]:
    out: list[chat.Message] = []
    for item in items:
        if item.type == "message":
            role = "system" if item.role == "developer" else item.role
            if role is None:
                raise InvalidRequest("a message item needs a role", "input")
            out.append(chat.Message(role, _text(item.content)))
        elif item.type == "function_call":
            if not item.call_id or not item.name:
                raise InvalidRequest("a function_call item needs call_id and name", "input")
            call = chat.ToolCall(item.call_id, item.name, item.arguments or "{}")
            last = out[-1] if out else None
            if last is not None and last.role == "assistant":
                out[-1] = chat.Message("assistant", last.content, (*last.tool_calls, call))
            else:
                out.append(chat.Message("assistant", "", (call,)))
        elif item.type == "function_call_output":
            if not item.call_id:
                raise InvalidRequest("a function_call_output item needs call_id", "input")
            out.append(chat.Message("tool", _text(item.output), tool_call_id=item.call_id))
        elif item.type != "reasoning":
            raise InvalidRequest(f"input items of type {item.type!r} are not supported", "input")
    return tuple(out)


def _text(content: str | list[Part] | None) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    for p in content:
        if p.type not in ("input_text", "output_text", "text", "refusal"):
            raise InvalidRequest(f"content parts of type {p.type!r} are not supported", "input")
    return "".join(p.text or "" for p in content)


def _function(tool: dict[str, Any]) -> dict[str, Any]:
    if tool.get("type", "function") != "function" or not tool.get("name"):
        raise InvalidRequest("each function tool needs a name", "tools")
    return {"type": "function", "function": {"name": tool["name"], "description": tool.get("description") or "",
                                             "parameters": tool.get("parameters") or {"type": "object"}}}


# -- responses -----------------------------------------------------------------


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] = Field(default_factory=list)


class OutputMessage(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    status: Literal["in_progress", "completed", "incomplete"] = "completed"
    content: list[OutputText]


class FunctionCallItem(BaseModel):
    id: str
    type: Literal["function_call"] = "function_call"
    call_id: str
    name: str
    arguments: str
    status: Literal["in_progress", "completed"] = "completed"
    #: the namespace tool the function came from; left out for a plain function tool
    namespace: str | None = Field(None, exclude_if=lambda ns: ns is None)


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class Usage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails = Field(default_factory=InputTokensDetails)
    output_tokens: int
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int

    @classmethod
    def of(cls, usage: chat.TokenUsage) -> Usage:
        return cls(input_tokens=usage.prompt_tokens, output_tokens=usage.completion_tokens,
                   total_tokens=usage.total_tokens)


class Response(BaseModel):
    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Literal["in_progress", "completed", "incomplete", "failed"]
    model: str
    output: list[OutputMessage | FunctionCallItem]
    usage: Usage | None = None
    error: dict[str, Any] | None = None
    incomplete_details: dict[str, Any] | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    parallel_tool_calls: bool
    previous_response_id: str | None = None
    temperature: float
    top_p: float
    tool_choice: str | dict[str, Any]
    tools: list[dict[str, Any]]
    store: bool
    text: dict[str, Any] = Field(default_factory=lambda: {"format": {"type": "text"}})
    truncation: str = "disabled"
    metadata: dict[str, Any] = Field(default_factory=dict)
    reasoning: dict[str, Any] | None = None

    def as_messages(self) -> tuple[chat.Message, ...]:
        """This response's output as the assistant turn a client would send back."""
        items = [Item(type="message", role="assistant", content=[Part(type="output_text", text=c.text)
                                                                 for c in o.content])
                 if isinstance(o, OutputMessage) else
                 Item(type="function_call", call_id=o.call_id, name=o.name, arguments=o.arguments)
                 for o in self.output]
        return fold_items(items)


def stored_id(response_json: str) -> str | None:
    """The id of a recorded Responses answer the client asked to store; None for any other body."""
    try:
        body = json.loads(response_json)
    except ValueError:
        return None
    if isinstance(body, dict) and body.get("object") == "response" and body.get("store"):
        return str(body["id"])
    return None
