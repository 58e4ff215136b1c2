"""Chat messages → prompt token ids, reusing the exact ids the model produced for its own earlier turns.

Re-tokenising the text of an assistant turn can give other ids than the model
sampled (BPE has many spellings of one string, and parsers rewrite tool-call
JSON), and then consecutive calls stop extending each other. So the prompt is
built in pieces: template text up to an earlier assistant turn, that turn's
generated ids (ending with the end-of-turn token), text again. Pieces meet at
special tokens, so the text pieces tokenise exactly as the whole text would.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedTokenizerBase

from gateway.chat import ChatRequest
from gateway.errors import InvalidRequest


@dataclass(frozen=True)
class Rendered:
    prompt_ids: list[int]
    text: str
    reused_turns: int  # assistant turns whose generated ids were reused


class Renderer:
    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the tokenizer has no chat template")
        self.tokenizer = tokenizer
        self.end_of_turn = str(tokenizer.eos_token)
        self.end_of_turn_id = int(tokenizer.convert_tokens_to_ids(self.end_of_turn))  # type: ignore[arg-type]
        self._backend = getattr(tokenizer, "backend_tokenizer", None)  # Rust, without the wrapper's overhead

    def template(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, open_turn: bool) -> str:
        try:
            text = self.tokenizer.apply_chat_template(
                messages, tools=tools or None, tokenize=False, add_generation_prompt=open_turn  # type: ignore[arg-type]
            )
        except Exception as exc:  # jinja raises whatever the template raises
            raise InvalidRequest(f"messages cannot be rendered with the model's chat template: {exc}",
                                 "messages") from exc
        return str(text)

    def encode(self, text: str) -> list[int]:
        if self._backend is not None:
            return list(self._backend.encode(text, add_special_tokens=False).ids)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

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
