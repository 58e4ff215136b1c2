"""Tool calls out of completion text, one parser per model family (pluggable by name)."""

from __future__ import annotations

import json
import re
import uuid
from typing import Protocol

from gateway.chat import ToolCall


class ToolParser(Protocol):
    #: Where a streamed answer may turn into a tool call; text from here on is held back while streaming.
    start_marker: str

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        """(content without the tool calls, tool calls); malformed calls stay in the content."""
        ...


class HermesParser:
    """Hermes/Qwen: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, any number of times."""

    start_marker = "<tool_call>"
    _block = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        calls: list[ToolCall] = []
        kept: list[str] = []
        last = 0
        for match in self._block.finditer(text):
            try:
                body = json.loads(match.group(1))
                name, arguments = body["name"], body.get("arguments", {})
                if not isinstance(name, str) or not isinstance(arguments, dict):
                    raise TypeError("a call needs a string name and an object of arguments")
            except (ValueError, RecursionError, KeyError, TypeError):  # JSONDecodeError is a ValueError
                continue  # not a well-formed call: it stays text, the harness sees what the model wrote
            kept.append(text[last:match.start()])
            last = match.end()
            calls.append(ToolCall(id=f"call_{uuid.uuid4().hex[:24]}", name=name, arguments=json.dumps(arguments)))
        kept.append(text[last:])
        return "".join(kept).strip() if calls else text, calls


PARSERS: dict[str, type[HermesParser]] = {"hermes": HermesParser, "qwen": HermesParser}


def parser_for(name: str) -> ToolParser:
    try:
        return PARSERS[name]()
    except KeyError:
        raise ValueError(f"unknown tool parser {name!r}; known: {', '.join(sorted(PARSERS))}") from None
