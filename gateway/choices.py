"""Engine chunks → each choice's ids, logprobs and text, and the deltas a stream may show at once.

Text is held back from a stream where a tool call may be starting (the
parser's marker, or a prefix of it at the end), so a harness never sees the
raw markup of a tool call it will receive whole.

A chunk carries its choices' token ids one of two ways (`gateway.adapters`):
as `token_ids` (asked with `return_token_ids`), or as the logprobs' tokens
named "token_id:N" (asked with `return_tokens_as_token_ids`), whose top
logprobs are named the same way and are shown by their text here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.chat import ChatRequest, Generation
from gateway.errors import EngineFailed
from gateway.tool_parsers import ToolParser

TOKEN_ID = "token_id:"  # how vLLM names a token under `return_tokens_as_token_ids`


@dataclass
class Delta:
    """Streamed content of one choice; tool calls come whole at the end."""

    index: int
    text: str


class Choices:
    """Per-choice accumulation of engine chunks; streamed text stops at a possible tool call."""

    def __init__(self, n: int, marker: str, token_text: Callable[[int], str]) -> None:
        self.marker = marker
        self.token_text = token_text  # a top logprob named by its id is shown by its text
        self.ids: dict[int, list[int]] = {i: [] for i in range(n)}
        self.logprobs: dict[int, list[float]] = {i: [] for i in range(n)}
        self.tops: dict[int, list[dict[str, float]]] = {i: [] for i in range(n)}
        self.text: dict[int, str] = {i: "" for i in range(n)}
        self.sent: dict[int, int] = {i: 0 for i in range(n)}
        self.finish_reasons: dict[int, str] = {}
        self.stop_reasons: dict[int, str | int | None] = {}

    def add(self, chunk: dict[str, Any]) -> list[Delta]:
        deltas = []
        for choice in chunk.get("choices", []):
            i = int(choice["index"])
            lp = choice.get("logprobs") or {}
            self.ids[i] += self._ids(choice, lp)
            self.logprobs[i] += lp.get("token_logprobs") or []
            self.tops[i] += [self._top(top) for top in lp.get("top_logprobs") or []]
            self.text[i] += choice.get("text") or ""
            if choice.get("finish_reason"):
                self.finish_reasons[i] = choice["finish_reason"]
                self.stop_reasons[i] = choice.get("stop_reason")
            safe = self._streamable(i)
            if safe > self.sent[i]:
                deltas.append(Delta(i, self.text[i][self.sent[i]:safe]))
                self.sent[i] = safe
        return deltas

    @staticmethod
    def _ids(choice: dict[str, Any], logprobs: dict[str, Any]) -> list[int]:
        """The choice's new token ids, whichever way the engine sent them."""
        ids = choice.get("token_ids")
        if ids is not None:
            return list(ids)
        tokens = logprobs.get("tokens")
        if tokens is None and not choice.get("text"):
            return []  # a chunk that adds nothing (a stream's last)
        try:
            return [_token_id(t) for t in tokens]  # type: ignore[union-attr]
        except (TypeError, ValueError):
            raise EngineFailed("the engine's answer carries no token ids (neither token_ids nor logprobs tokens "
                               f"named token_id:N, got {str(tokens)[:60]}): is its kind set right "
                               "(TETHER_GATEWAY_ENGINE_KIND)?") from None

    def _top(self, top: dict[str, float] | None) -> dict[str, float]:
        return {self._text(name): lp for name, lp in (top or {}).items()}

    def _text(self, name: str) -> str:
        """A top logprob's token as text, whether the engine named it by its text or by its id."""
        try:
            return self.token_text(_token_id(name))
        except ValueError:
            return name

    def _streamable(self, i: int) -> int:
        """Text up to a tool-call marker (or a prefix of one at the end) can be shown at once."""
        text = self.text[i]
        at = text.find(self.marker)
        if at >= 0:
            return at
        for k in range(min(len(self.marker) - 1, len(text)), 0, -1):
            if self.marker.startswith(text[-k:]):
                return len(text) - k
        return len(text)

    def rest(self, generations: list[Generation]) -> list[Delta]:
        return [Delta(g.index, g.content[self.sent[g.index]:]) for g in generations
                if not g.tool_calls and len(g.content) > self.sent[g.index]]

    def finish(self, parser: ToolParser, chat: ChatRequest) -> list[Generation]:
        out = []
        for i in sorted(self.ids):
            text = self.text[i]
            content, calls = parser.parse(text) if chat.tools and chat.tool_choice != "none" else (text, [])
            if not calls:
                content = text
            reason = "tool_calls" if calls else self.finish_reasons.get(i, "stop")
            out.append(Generation(index=i, token_ids=self.ids[i], logprobs=self.logprobs[i], top_logprobs=self.tops[i],
                                  text=text, finish_reason=reason, content=content, tool_calls=calls,
                                  stop_reason=self.stop_reasons.get(i)))
        return out


def _token_id(token: object) -> int:
    """N of a token named "token_id:N"; ValueError for anything else (a token named by its text)."""
    if not isinstance(token, str) or not token.startswith(TOKEN_ID):
        raise ValueError(token)
    digits = token[len(TOKEN_ID):]
    if not digits.isascii() or not digits.isdigit():
        raise ValueError(token)
    return int(digits)
