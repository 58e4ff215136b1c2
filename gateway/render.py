"""Chat messages → prompt token ids, reusing the exact ids the model produced for its own earlier turns.

Re-tokenising the text of an assistant turn can give other ids than the model
sampled (BPE has many spellings of one string, and parsers rewrite tool-call
JSON), and then consecutive calls stop extending each other. So the prompt is
built in pieces: template text up to an earlier assistant turn, that turn's
generated ids (ending with the end-of-turn token), text again. Pieces meet at
special tokens, so the text pieces tokenise exactly as the whole text would.

A harness resends its whole conversation each call. The rendering of a call
(`RenderState`) lets the next call of the rollout resume where it stopped
instead of checking every earlier turn again: when the new conversation
begins with the old one, under the same tools, and the template's text
begins with the old text, every decision about the earlier turns is the
same, so only the turns added are checked and only the text added is
tokenised. Anything else takes the whole way; the two give the same ids by
construction (and `tests/test_gateway_render.py` holds them equal).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gateway.chat import ChatRequest, Message, message_key
from gateway.errors import InvalidRequest
from gateway.tokenizer import ChatTokenizer


@dataclass(frozen=True, slots=True)
class RenderState:
    """Where a rendering stopped: the conversation, its text and ids, and the decisions about its turns."""

    messages: tuple[Message, ...]
    tools: tuple[dict[str, Any], ...]
    text: str  # the template's text, generation prompt included
    ids: list[int]  # the prompt
    done: int  # characters of `text` before its last text piece
    head: int  # ids before the last text piece
    #: per assistant turn: the ids reused for it (compared by identity), or None where there were none
    generated: tuple[tuple[int, list[int] | None], ...]
    reused: int
    #: False where a turn whose text did not extend the template's could extend a longer conversation's
    resumable: bool


@dataclass(frozen=True)
class Rendered:
    prompt_ids: list[int]
    text: str
    reused_turns: int  # assistant turns whose generated ids were reused
    state: RenderState | None = None  # for the rollout's next call
    resumed: bool = False  # taken from the rollout's previous rendering rather than from the start


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

    def render(self, request: ChatRequest, generated: Callable[[int], list[int] | None],
               after: RenderState | None = None, remembered: bool = True) -> Rendered:
        """Prompt ids for `request`; `generated(i)` gives the ids the model produced for assistant message i.
        `after`: the rollout's previous rendering, resumed from where the conversation continues it.
        `remembered`: False tokenises every piece afresh (to check the tokenizer's cache of pieces)."""
        encode = self.encode if remembered else self.tokenizer.encode_whole
        messages = [m.for_template() for m in request.messages]
        tools = list(request.tools)
        full = self.template(messages, tools, open_turn=True)
        resumed = after if after is not None and _continues(after, request, full, generated) else None
        if resumed is not None:
            first, ids, done, reused = len(resumed.messages), resumed.ids[:resumed.head], resumed.done, resumed.reused
            decided, resumable = list(resumed.generated), True
        else:
            first, ids, done, reused, decided, resumable = 0, [], 0, 0, [], True
        for i in range(first, len(request.messages)):
            if request.messages[i].role != "assistant":
                continue
            turn_ids = generated(i)
            decided.append((i, turn_ids))
            if turn_ids is None:
                continue
            if resumed is not None and i == first and self.tokenizer.timeless:
                before = resumed.text  # the same conversation renders the same text
            else:
                before = self.template(messages[:i], tools, open_turn=True)
            through = self.template(messages[: i + 1], tools, open_turn=False)
            end = through.rfind(self.end_of_turn)
            if not (full.startswith(through) and through.startswith(before) and len(before) >= done and end >= 0):
                # this template does not render turns as prefixes: fall back to the text; a longer conversation
                # whose text did begin with `through` would decide otherwise, so it could not resume from here
                resumable = resumable and len(through) <= len(full)
                continue
            ids += self._piece(resumed, full, done, len(before), encode)
            ids += turn_ids if turn_ids and turn_ids[-1] == self.end_of_turn_id else [*turn_ids, self.end_of_turn_id]
            done = end + len(self.end_of_turn)
            reused += 1
        head = len(ids)
        ids += self._piece(resumed, full, done, len(full), encode)
        state = RenderState(messages=request.messages, tools=request.tools, text=full, ids=ids, done=done, head=head,
                            generated=tuple(decided), reused=reused, resumable=resumable)
        return Rendered(ids, full, reused, state, resumed=resumed is not None)

    @staticmethod
    def _piece(after: RenderState | None, full: str, start: int, end: int,
               encode: Callable[[str], list[int]]) -> list[int]:
        """The ids of full[start:end]: the previous rendering's last piece where it is that (the new text
        begins with the old), else tokenised."""
        if after is not None and start == after.done and end == len(after.text):
            return after.ids[after.head:]
        return encode(full[start:end])


def differs(renderer: Renderer, request: ChatRequest, generated: Callable[[int], list[int] | None],
            rendered: Rendered) -> Rendered | None:
    """The rendering from the first message, every piece tokenised afresh, where its ids are not `rendered`'s."""
    whole = renderer.render(request, generated, remembered=False)
    return whole if whole.prompt_ids != rendered.prompt_ids else None


def _continues(after: RenderState, request: ChatRequest, full: str,
               generated: Callable[[int], list[int] | None]) -> bool:
    """Whether `request` (whose template text is `full`) can resume from `after`: every decision about the turns
    `after` rendered would be the same."""
    if not after.resumable or request.tools != after.tools or not full.startswith(after.text):
        return False
    k = len(after.messages)
    if len(request.messages) < k or request.messages[:k] != after.messages:
        return False
    # the same ids for each earlier turn (a turn without any may have got them since, from a later generation)
    return all(generated(i) is ids for i, ids in after.generated)


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
