"""Chat messages → prompt token ids, reusing the exact ids the model produced for its own earlier turns.

Re-tokenising the text of an assistant turn can give other ids than the model
sampled (BPE has many spellings of one string, and parsers rewrite tool-call
JSON), and then consecutive calls stop extending each other. So the prompt is
built in pieces: template text up to an earlier assistant turn, that turn's
generated ids (ending with the end-of-turn token), text again. Pieces meet at
special tokens, so the text pieces tokenise exactly as the whole text would.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gateway.chat import ChatRequest, message_key
from gateway.errors import InvalidRequest
from gateway.tokenizer import ChatTokenizer


@dataclass(frozen=True)
class Rendered:
    prompt_ids: list[int]
    text: str
    reused_turns: int  # assistant turns whose generated ids were reused


class Renderer:
    def __init__(self, tokenizer: ChatTokenizer) -> None:
        self.tokenizer = tokenizer
        self.end_of_turn = tokenizer.eos_token
        self.end_of_turn_id = tokenizer.eos_token_id
        self.encode = tokenizer.encode

    def token_text(self, token_id: int) -> str:
        """One token as text, as logprobs show it."""
        return self.tokenizer.decode([token_id])

    def template(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, open_turn: bool) -> str:
        try:
            return self.tokenizer.apply_chat_template(messages, tools or None, add_generation_prompt=open_turn)
        except Exception as exc:  # jinja raises whatever the template raises
            raise InvalidRequest(f"messages cannot be rendered with the model's chat template: {exc}",
                                 "messages") from exc

    def render(self, request: ChatRequest, generated: Callable[[int], list[int] | None]) -> Rendered:
        """Prompt ids for `request`; `generated(i)` gives the ids the model produced for assistant message i."""
        messages = [m.for_template() for m in request.messages]
        tools = list(request.tools)
        full = self.template(messages, tools, open_turn=True)
        ids: list[int] = []
        done = 0  # characters of `full` already turned into ids
        reused = 0
        for i, message in enumerate(request.messages):
            if message.role != "assistant":
                continue
            turn_ids = generated(i)
            if turn_ids is None:
                continue
            before = self.template(messages[:i], tools, open_turn=True)
            through = self.template(messages[: i + 1], tools, open_turn=False)
            end = through.rfind(self.end_of_turn)
            if not (full.startswith(through) and through.startswith(before) and len(before) >= done and end >= 0):
                continue  # this template does not render turns as prefixes: fall back to the text
            ids += self.encode(full[done:len(before)])
            ids += turn_ids if turn_ids and turn_ids[-1] == self.end_of_turn_id else [*turn_ids, self.end_of_turn_id]
            done = end + len(self.end_of_turn)
            reused += 1
        ids += self.encode(full[done:])
        return Rendered(ids, full, reused)


def own_turns(chat: ChatRequest, turns: Mapping[str, list[list[int]]]) -> Callable[[int], list[int] | None]:
    """`generated` for `Renderer.render`: the k-th assistant message with a given text is the k-th generation
    that produced that text. Texts can repeat with other ids (a byte-level token can decode to nothing)."""
    seen: Counter[str] = Counter()
    found: dict[int, list[int]] = {}
    for i, m in enumerate(chat.messages):
        if m.role == "assistant":
            key = message_key(m.content, m.tool_calls)
            spellings = turns.get(key, [])
            if seen[key] < len(spellings):
                found[i] = spellings[seen[key]]
            seen[key] += 1
    return found.get
