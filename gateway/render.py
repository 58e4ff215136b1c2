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
begins with the old one, under the same tools, every decision about the
earlier turns is the same, so only the turns added are checked and only the
text added is tokenised.

The template's text of the added turns comes one of two ways:

- **beside a stub** (`Stub`), where a probe at load (`probe_stub`) finds the
  template local: the text of a conversation is the text of any prefix of it,
  closed, followed by what the added messages render to after a stub of the
  first message and the prefix's last one. Then a call renders a few messages,
  however long its rollout, and costs the same at 1k tokens and at 128k.
- **whole**: the template renders the whole conversation, and a call resumes
  only where that text begins with the previous call's. This is the way for
  templates that rewrite earlier turns as the conversation grows (reasoning
  dropped before the last user turn, a date in the system turn) and wherever
  a stub's rendering does not prove itself (a tool result that continues the
  previous one).

Every way gives the ids of rendering from the start by construction;
`tests/test_gateway_render.py` holds them equal on generated conversations,
and the gateway can check a sample of calls (`differs`).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.chat import ChatRequest, Message, ToolCall, message_key
from gateway.errors import InvalidRequest
from gateway.extends import packed
from gateway.tokenizer import ChatTokenizer

log = logging.getLogger("tether.gateway")


@dataclass(frozen=True, slots=True)
class RenderState:
    """Where a rendering stopped: the conversation, its text and ids, and the decisions about its turns."""

    messages: tuple[Message, ...]
    tools: tuple[dict[str, Any], ...]
    text: str  # the template's text, generation prompt included
    ids: list[int]  # the prompt
    packed: bytes  # the same, packed (`gateway.extends.packed`)
    done: int  # characters of `text` before its last text piece
    head: int  # ids before the last text piece
    #: per assistant turn: the ids reused for it (compared by identity), or None where there were none
    generated: tuple[tuple[int, list[int] | None], ...]
    #: which ids `OwnTurns` gave each assistant message (None: rendered with another `generated`)
    index: TurnIndex | None
    reused: int
    #: False where a turn whose text did not extend the template's could extend a longer conversation's
    resumable: bool
    #: `ids` may be extended in place by the next rendering (its call is over: `release`), once
    lease: _Lease = field(default_factory=lambda: _Lease())

    def release(self) -> None:
        """The call rendered with this state is over: nothing reads its prompt's ids any more, so the rollout's
        next rendering may cut and extend that list in place instead of copying it (O(n) for a long context)."""
        self.lease.free = True

    def prefix(self, head: int) -> list[int]:
        """`ids[:head]`, taken in place where the list is free (then it is no longer this state's to read)."""
        if self.lease.free and not self.lease.taken:
            self.lease.taken = True
            del self.ids[head:]
            return self.ids
        return self.ids[:head]


class _Lease:
    __slots__ = ("free", "taken")

    def __init__(self) -> None:
        self.free = False
        self.taken = False


@dataclass(frozen=True)
class Rendered:
    prompt_ids: list[int]
    packed: bytes  # prompt_ids packed
    text: str
    reused_turns: int  # assistant turns whose generated ids were reused
    state: RenderState | None = None  # for the rollout's next call
    resumed: bool = False  # taken from the rollout's previous rendering rather than from the start
    stub: bool = False  # the added turns' text rendered beside a stub, not the whole conversation's


@dataclass(frozen=True, slots=True)
class TurnIndex:
    """What `OwnTurns` decided for a conversation, kept with its rendering (never changed after), so that the
    rollout's next call looks up only the messages added: per assistant message the ids found for it (`found`),
    how often each key has occurred (`seen`), and the occurrences that had no ids yet (`missing`: message, key,
    occurrence), which a later generation can supply."""

    found: dict[int, list[int]] = field(default_factory=dict)
    seen: dict[str, int] = field(default_factory=dict)
    missing: tuple[tuple[int, str, int], ...] = ()


class OwnTurns:
    """`generated` for `Renderer.render`: the k-th assistant message with a given text is the k-th generation
    that produced that text (texts can repeat with other ids: a byte-level token can decode to nothing).

    Built with the rollout's previous rendering, it starts from that rendering's `TurnIndex` and keys only the
    messages added since (a key is a digest of the message), so its cost does not grow with the rollout; it
    remembers that `chat` continues `after`, and whether any earlier message got ids it did not have then
    (`filled`), so that the renderer need not compare the earlier turns one by one."""

    def __init__(self, chat: ChatRequest, turns: Mapping[str, list[list[int]]],
                 after: RenderState | None = None) -> None:
        previous = after.index if after is not None else None
        known = after is not None and previous is not None and _begins(chat, after)
        self.after = after if known else None
        start = previous if known and previous is not None else TurnIndex()
        found, seen, missing = dict(start.found), dict(start.seen), []
        self.filled = False  # an occurrence without ids before has them now (lists of spellings only grow)
        for i, key, j in start.missing:
            spellings = turns.get(key)
            if spellings is not None and j < len(spellings):
                found[i] = spellings[j]
                self.filled = True
            else:
                missing.append((i, key, j))
        first = len(after.messages) if known and after is not None else 0
        added = [(i, message_key(m.content, m.tool_calls)) for i, m in enumerate(chat.messages[first:], first)
                 if m.role == "assistant"]
        for i, key in added:
            j = seen.get(key, 0)
            spellings = turns.get(key)
            if spellings is not None and j < len(spellings):
                found[i] = spellings[j]
            else:
                missing.append((i, key, j))
            seen[key] = j + 1
        self.found = found
        self.index = TurnIndex(found, seen, tuple(missing))

    def __call__(self, i: int) -> list[int] | None:
        return self.found.get(i)


def own_turns(chat: ChatRequest, turns: Mapping[str, list[list[int]]],
              after: RenderState | None = None) -> OwnTurns:
    return OwnTurns(chat, turns, after)


class NotLocal(Exception):
    """A stub's rendering does not extend the stub's own text: render the whole conversation instead."""


@dataclass(frozen=True)
class Stub:
    """How a local template renders added messages: beside the conversation's first message and the last one
    before them, with the same tools. `generation`: the text the generation prompt adds (the same everywhere)."""

    generation: str


Template = Callable[[list[dict[str, Any]], list[dict[str, Any]] | None, bool], str]


def stub_texts(template: Template, first: dict[str, Any], previous: list[dict[str, Any]],
               added: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> Callable[[int, bool], str]:
    """text(j, open_turn): what `added[:j]` adds to the closed text of the conversation before them, rendered
    beside a stub (`first`, then `previous`: the message before `added`, or none when that is `first`)."""
    stub = [first, *previous]
    base = template(stub, tools, False)

    def text(j: int, open_turn: bool) -> str:
        rendered = template(stub + added[:j], tools, open_turn)
        if not rendered.startswith(base):
            raise NotLocal
        return rendered[len(base):]

    return text


_PROBE_TOOLS = [{"type": "function", "function": {"name": "probe_lookup", "description": "Look a word up.",
                                                  "parameters": {"type": "object",
                                                                 "properties": {"q": {"type": "string"}}}}}]


def _probe_conversations() -> list[list[Message]]:
    def call(n: int, text: str = "") -> Message:
        return Message("assistant", text, (ToolCall(f"probe-{n}", "probe_lookup", f'{{"q": "w{n}"}}'),))

    def result(n: int) -> Message:
        return Message("tool", f"result {n}", tool_call_id=f"probe-{n}")

    system, user = Message("system", "Probe system."), Message("user", "Probe question?")
    return [
        [system, user, call(1), result(1), call(2, "Two more."), result(2), call(3), result(3), result(3),
         Message("assistant", "Done: w."), Message("user", "And y?"), call(4), result(4)],
        [user, Message("assistant", "<think>\nweigh it\n</think>\n\nIt is x."), Message("user", "Sure?"),
         Message("assistant", "<think>\nagain\n</think>\n\nYes."), Message("user", "Why?"), call(5), result(5),
         Message("assistant", "Because.")],
        [system, user, Message("assistant", "First."), Message("system", "Be brief."), Message("user", "Again?"),
         Message("assistant", "Second."), Message("user", "Once more?"), Message("assistant", "Third.")],
    ]


def probe_stub(template: Template) -> tuple[Stub | None, str]:
    """Whether `template` renders added messages beside a stub as it renders them in the whole conversation, on
    conversations of every shape a harness sends (tool calls and results, consecutive results, reasoning, user
    turns after the model's, a system turn in the middle), with tools and without: the stub, or None and why."""
    generation: str | None = None
    for conversation in _probe_conversations():
        dicts = [m.for_template() for m in conversation]
        for tools in (None, _PROBE_TOOLS):
            try:  # the conversation's first j messages, closed and open (an empty one: nothing to render)
                closed = [""] + [template(dicts[:j], tools, False) for j in range(1, len(dicts) + 1)]
                opened = [""] + [template(dicts[:j], tools, True) for j in range(1, len(dicts) + 1)]
            except Exception:  # a shape this template refuses (roles that must alternate): nothing to learn
                continue
            for j in range(1, len(dicts) + 1):
                if not opened[j].startswith(closed[j]):
                    return None, "its generation prompt rewrites the text before it"
                if generation is None:
                    generation = opened[j][len(closed[j]):]
                if opened[j][len(closed[j]):] != generation:
                    return None, "its generation prompt differs between conversations"
            for k in range(1, len(dicts)):
                try:
                    text = stub_texts(template, dicts[0], dicts[k - 1:k] if k > 1 else [], dicts[k:], tools)
                except Exception:
                    continue  # the stub itself is refused: calls render whole
                for j in range(1, len(dicts) - k + 1):
                    for open_turn in (False, True):
                        try:
                            added = text(j, open_turn)
                        except Exception:
                            continue  # NotLocal, or refused: that call renders whole
                        whole = (opened if open_turn else closed)[k + j]
                        if whole != closed[k] + added:
                            return None, (f"the text of {j} message(s) after {k} depends on more than the first "
                                          "and the previous message")
    if generation is None:
        return None, "it rendered none of the probe's conversations"
    return Stub(generation), "local"


class Renderer:
    def __init__(self, tokenizer: ChatTokenizer, stub: bool = True) -> None:
        self.tokenizer = tokenizer
        self.end_of_turn = tokenizer.eos_token
        self.end_of_turn_id = tokenizer.eos_token_id
        self.encode = tokenizer.encode
        self._token_text = functools.lru_cache(maxsize=1 << 16)(lambda token_id: tokenizer.decode([token_id]))
        self.stub: Stub | None = None
        if stub and tokenizer.timeless:
            self.stub, why = probe_stub(self.template)
            log.info("chat template: %s", "added turns rendered beside a stub" if self.stub else
                     f"every call renders the whole conversation ({why})")

    def token_text(self, token_id: int) -> str:
        """One token as text, as logprobs show it; remembered, since an engine that names tokens by their ids
        (`gateway.choices`) has each of a call's top alternatives shown by its text."""
        return self._token_text(token_id)

    def template(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, open_turn: bool) -> str:
        try:
            return self.tokenizer.apply_chat_template(messages, tools or None, add_generation_prompt=open_turn)
        except Exception as exc:  # jinja raises whatever the template raises
            raise InvalidRequest(f"messages cannot be rendered with the model's chat template: {exc}",
                                 "messages") from exc

    def render(self, request: ChatRequest, generated: Callable[[int], list[int] | None],
               after: RenderState | None = None, remembered: bool = True) -> Rendered:
        """Prompt ids for `request`; `generated(i)` gives the ids the model produced for assistant message i
        (`own_turns`). `after`: the rollout's previous rendering, resumed from where the conversation continues
        it. `remembered`: False tokenises every piece afresh (to check the tokenizer's cache of pieces)."""
        continued = after is not None and _continues(after, request, generated)
        with self.tokenizer.same_inputs():
            if continued and self.stub is not None and after is not None and \
                    after.text.endswith(self.stub.generation):
                try:
                    return self._render(request, generated, after, remembered, stubbed=True)
                except NotLocal:
                    pass
            return self._render(request, generated, after if continued else None, remembered, stubbed=False)

    def _render(self, request: ChatRequest, generated: Callable[[int], list[int] | None],
                after: RenderState | None, remembered: bool, stubbed: bool) -> Rendered:
        encode = self.encode if remembered else self.tokenizer.encode_whole
        tools = list(request.tools)
        k = len(after.messages) if after is not None else 0
        if stubbed:  # texts from `after.done` on: the previous last piece (closed), then the stub's additions
            assert after is not None and self.stub is not None
            origin = after.done
            shared = after.text[origin:len(after.text) - len(self.stub.generation)]
            added = [m.for_template() for m in request.messages[k:]]
            previous = [request.messages[k - 1].for_template()] if k > 1 else []
            addition = stub_texts(self._template_or_not_local, request.messages[0].for_template(), previous, added,
                                  tools)

            def text(j: int, open_turn: bool) -> str:
                return shared + addition(j - k, open_turn)
        else:
            origin = 0
            messages = [m.for_template() for m in request.messages]

            def text(j: int, open_turn: bool) -> str:
                return self.template(messages[:j], tools, open_turn)
        full = text(len(request.messages), True)
        resumed = after
        if resumed is not None and not stubbed and not full.startswith(resumed.text):
            resumed = None  # the text of the earlier turns changed: every decision is made again
        return self._pieces(request, generated, resumed, text, full, origin, encode, stubbed)

    def _template_or_not_local(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                               open_turn: bool) -> str:
        """A stub the template refuses (roles that must alternate) is not an error in the request: whole, then."""
        try:
            return self.template(messages, tools, open_turn)
        except InvalidRequest as exc:
            raise NotLocal from exc

    def _pieces(self, request: ChatRequest, generated: Callable[[int], list[int] | None],
                resumed: RenderState | None, text: Callable[[int, bool], str], full: str, origin: int,
                encode: Callable[[str], list[int]], stubbed: bool) -> Rendered:
        """The prompt from the template's text (`text(j, open_turn)`: of the first j messages, from character
        `origin` on; `full`: of all of them, open), each assistant turn with ids reused in place of its text."""
        # the ids after the resumed rendering's head; joined to its prefix only once nothing can fail
        ids: list[int] = []
        if resumed is not None:
            first, done, reused = len(resumed.messages), resumed.done, resumed.reused
            decided, resumable, kept = list(resumed.generated), resumed.resumable, resumed.head
        else:
            first, done, reused, decided, resumable, kept = 0, 0, 0, [], True, 0
        for i in range(first, len(request.messages)):
            if request.messages[i].role != "assistant":
                continue
            turn_ids = generated(i)
            decided.append((i, turn_ids))
            if turn_ids is None:
                continue
            if resumed is not None and i == first and self.tokenizer.timeless:
                before = resumed.text[origin:]  # the same conversation renders the same text
            else:
                before = text(i, True)
            through = text(i + 1, False)
            end = through.rfind(self.end_of_turn)
            if not (full.startswith(through) and through.startswith(before) and len(before) >= done - origin
                    and end >= 0):
                # this template does not render turns as prefixes: fall back to the text; a longer conversation
                # whose text did begin with `through` would decide otherwise, so it could not resume from here
                resumable = resumable and len(through) <= len(full)
                continue
            ids += self._piece(resumed, full, origin, done, origin + len(before), encode)
            ids += turn_ids if turn_ids and turn_ids[-1] == self.end_of_turn_id else [*turn_ids, self.end_of_turn_id]
            done = origin + end + len(self.end_of_turn)
            reused += 1
        head = kept + len(ids)
        ids += self._piece(resumed, full, origin, done, origin + len(full), encode)
        whole_text = resumed.text[:origin] + full if resumed is not None else full
        # one copy of the kept bytes, not two (a slice, then the sum)
        packed_ids = (b"".join((memoryview(resumed.packed)[:kept * 4], packed(ids))) if resumed is not None
                      else packed(ids))
        if resumed is not None:
            added, ids = ids, resumed.prefix(kept)
            ids += added
        index = generated.index if isinstance(generated, OwnTurns) else None
        state = RenderState(messages=request.messages, tools=request.tools, text=whole_text, ids=ids,
                            packed=packed_ids, done=done, head=head, generated=tuple(decided), index=index,
                            reused=reused, resumable=resumable)
        return Rendered(ids, packed_ids, whole_text, reused, state, resumed=resumed is not None, stub=stubbed)

    @staticmethod
    def _piece(after: RenderState | None, full: str, origin: int, start: int, end: int,
               encode: Callable[[str], list[int]]) -> list[int]:
        """The ids of the text from `start` to `end` (`full` holds it from `origin` on): the previous rendering's
        last piece where it is that text, else tokenised."""
        piece = full[start - origin:end - origin]
        if after is not None and start == after.done and piece == after.text[after.done:]:
            return after.ids[after.head:]
        return encode(piece)


def differs(renderer: Renderer, request: ChatRequest, generated: Callable[[int], list[int] | None],
            rendered: Rendered) -> Rendered | None:
    """The rendering from the first message, every piece tokenised afresh, where its ids are not `rendered`'s."""
    whole = renderer.render(request, generated, remembered=False)
    return whole if whole.prompt_ids != rendered.prompt_ids else None


def _begins(request: ChatRequest, after: RenderState) -> bool:
    k = len(after.messages)
    return len(request.messages) >= k and request.messages[:k] == after.messages


def _continues(after: RenderState, request: ChatRequest, generated: Callable[[int], list[int] | None]) -> bool:
    """Whether `request` can resume from `after` (the template's text permitting): every decision about the turns
    `after` rendered would be the same."""
    if not after.resumable or request.tools != after.tools or not after.messages:
        return False
    if isinstance(generated, OwnTurns) and generated.after is after:
        # built from `after`'s own index: every earlier turn keeps its ids unless one without any got them since
        return not generated.filled
    if not _begins(request, after):
        return False
    # the same ids for each earlier turn (a turn without any may have got them since, from a later generation)
    return all(generated(i) is ids for i, ids in after.generated)
