"""Prompts extend each other across turns: the model's own turns come back as the ids it produced."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

import gateway.render as render_module
from gateway.chat import ChatRequest, Message, ToolCall, message_key
from gateway.render import Renderer, differs, own_turns, probe_stub
from gateway.tokenizer import ChatTokenizer
from gateway.tool_parsers import HermesParser

TOOLS = ({"type": "function", "function": {"name": "lookup", "description": "Look a word up.",
                                           "parameters": {"type": "object",
                                                          "properties": {"q": {"type": "string"}}}}},)


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path) -> ChatTokenizer:
    return ChatTokenizer.load(tiny_model)


class Harness:
    """A non-compacting agent loop: it sends back every turn as it received it (tool call JSON re-serialised)."""

    def __init__(self, renderer: Renderer) -> None:
        self.renderer = renderer
        self.messages: list[Message] = [Message("system", "Answer with the tool."), Message("user", "What is x?")]
        self.turns: dict[str, list[list[int]]] = {}
        self.calls: list[tuple[list[int], list[int]]] = []

    def call(self, generated_ids: list[int]) -> None:
        request = ChatRequest(tuple(self.messages), TOOLS)
        prompt = self.renderer.render(request, own_turns(request, self.turns)).prompt_ids
        self.calls.append((prompt, generated_ids))
        text = str(self.renderer.tokenizer.decode(generated_ids, skip_special_tokens=True))
        content, calls = HermesParser().parse(text)
        self.turns.setdefault(message_key(content, calls), []).append(generated_ids)
        # The harness echoes the turn back the way OpenAI SDKs do, then adds the tool's answer.
        echoed = tuple(ToolCall(c.id, c.name, json.dumps(json.loads(c.arguments), separators=(",", ":")))
                       for c in calls)
        self.messages.append(Message("assistant", content, echoed))
        for c in calls:
            self.messages.append(Message("tool", f"result for {c.name}", tool_call_id=c.id))
        if not calls:
            self.messages.append(Message("user", "Go on."))


def extends(calls: list[tuple[list[int], list[int]]]) -> bool:
    return all(nxt[:len(p) + len(g)] == p + g for (p, g), (nxt, _) in itertools.pairwise(calls))


def test_tool_turns_are_reused_exactly(tokenizer: ChatTokenizer) -> None:
    renderer = Renderer(tokenizer)
    harness = Harness(renderer)
    im_end = tokenizer.eos_token_id
    for q in ("x", "y z", "w"):
        text = f'<tool_call>\n{{"name": "lookup", "arguments": {{"q":   "{q}"}}}}\n</tool_call>'
        harness.call([*tokenizer.encode(text), im_end])
    harness.call([*tokenizer.encode("It is 42."), im_end])
    assert extends(harness.calls)


@settings(max_examples=40)
@given(st.lists(st.lists(st.integers(3, 2047), min_size=1, max_size=30), min_size=2, max_size=5))
def test_any_generated_ids_come_back_unchanged(tokenizer: ChatTokenizer, turns: list[list[int]]) -> None:
    """Even ids whose text re-tokenises differently (a random model writes such things)."""
    renderer = Renderer(tokenizer)
    harness = Harness(renderer)
    im_end = tokenizer.eos_token_id
    for ids in turns:
        harness.call([*ids, im_end])
    assert extends(harness.calls)


def test_without_reuse_text_is_rendered_by_the_template(tokenizer: ChatTokenizer) -> None:
    renderer = Renderer(tokenizer)
    request = ChatRequest((Message("user", "hi"), Message("assistant", "hello"), Message("user", "bye")))
    rendered = renderer.render(request, lambda i: None)
    assert rendered.reused_turns == 0
    assert rendered.prompt_ids == tokenizer.encode(rendered.text)
    assert rendered.text.endswith("<|im_start|>assistant\n")


def test_a_call_needs_a_name_and_an_object_of_arguments() -> None:
    parser = HermesParser()
    content, calls = parser.parse('<tool_call>\n{"name": "run", "arguments": "ls -la"}\n</tool_call>')
    assert calls == [] and "ls -la" in content  # not a well-formed call: the harness sees the text
    content, calls = parser.parse('Let me look.\n<tool_call>\n{"name": "lookup", "arguments": {"q": "x"}}\n'
                                  '</tool_call>')
    assert content == "Let me look." and [(c.name, json.loads(c.arguments)) for c in calls] == [("lookup", {"q": "x"})]


texts = st.text(st.characters(codec="utf-8"), max_size=40)
tool_calls = st.lists(st.builds(lambda n, q: {"id": "c", "type": "function",
                                              "function": {"name": n, "arguments": json.dumps({"q": q})}},
                                st.sampled_from(["lookup", "submit"]), texts), max_size=2)
messages = st.lists(st.one_of(
    st.builds(lambda c: {"role": "user", "content": c}, texts),
    st.builds(lambda c, calls: {"role": "assistant", "content": c, "tool_calls": calls}, texts, tool_calls),
    st.builds(lambda c: {"role": "tool", "content": c, "tool_call_id": "c"}, texts),
), min_size=1, max_size=6)


@settings(max_examples=60)
@given(st.one_of(st.none(), st.just("Be brief.")), messages, st.booleans(), st.booleans())
def test_renders_and_encodes_like_transformers(tiny_model: Path, system: str | None, chat: list[dict[str, object]],
                                               with_tools: bool, open_turn: bool) -> None:
    """The gateway's light tokenizer is the model's tokenizer: same text, same ids as transformers gives."""
    ours, reference = ChatTokenizer.load(tiny_model), reference_tokenizer(tiny_model)
    if system:
        chat = [{"role": "system", "content": system}, *chat]
    tools = [dict(t) for t in TOOLS] if with_tools else None
    text = ours.apply_chat_template(chat, tools, add_generation_prompt=open_turn)
    assert text == reference.apply_chat_template(chat, tools=tools, tokenize=False, add_generation_prompt=open_turn)
    assert ours.encode(text) == reference(text, add_special_tokens=False)["input_ids"]
    assert ours.eos_token_id == reference.eos_token_id


_reference: dict[Path, object] = {}


def reference_tokenizer(path: Path) -> Any:
    if path not in _reference:
        _reference[path] = AutoTokenizer.from_pretrained(path)
    return _reference[path]


# -- resuming from the previous call's rendering -------------------------------------------------------------------

#: like the tiny model's template, but an assistant turn before the last user message loses its text (as templates
#: that drop earlier reasoning do), and the system turn carries the date: a template whose earlier text changes
FORGETFUL = (
    "{%- set ns = namespace(last_user=-1) %}"
    "{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}{%- endfor %}"
    "{{- '<|im_start|>system\\nToday is ' + strftime_now('%Y-%m-%d') + '<|im_end|>\\n' }}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if loop.index0 > ns.last_user %}{{- m.content }}{%- endif %}"
    "{%- for c in m.tool_calls or [] %}{{- '<tool_call>' + c.function.name + '</tool_call>' }}{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

#: the same without the clock: timeless, so a stub is tried, and the probe must find it is not local
REASONING = FORGETFUL.replace("'<|im_start|>system\\nToday is ' + strftime_now('%Y-%m-%d') + '<|im_end|>\\n'",
                              "'<|im_start|>system\\nBe helpful.<|im_end|>\\n'")
#: the tiny model's own, but each turn numbered: its text depends on its place in the conversation
NUMBERED = "{%- for m in messages %}{{- '<|im_start|>' + m.role + ' ' + loop.index|string + '\\n' + m.content + " \
    "'<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
TEMPLATES = {"forgetful": FORGETFUL, "reasoning": REASONING, "numbered": NUMBERED}


@pytest.mark.parametrize(("name", "why"), [("forgetful", None), ("reasoning", "depends on more than"),
                                           ("numbered", "depends on more than")])
def test_the_probe_lets_only_a_local_template_render_beside_a_stub(tiny_model: Path, name: str,
                                                                   why: str | None) -> None:
    loaded = ChatTokenizer.load(tiny_model)
    assert Renderer(loaded).stub is not None
    other = ChatTokenizer(loaded.backend, TEMPLATES[name], loaded.special_tokens)
    assert Renderer(other).stub is None  # a clock: never probed; the others fail it
    if why is not None:
        stub, reason = probe_stub(Renderer(other, stub=False).template)
        assert stub is None and why in reason


steps = st.lists(st.tuples(
    st.sampled_from(["tool", "tool", "two tools", "user", "rewrite", "compact", "tools", "repeat", "late", "inject",
                     "answer"]),
    st.lists(st.integers(3, 1036), min_size=1, max_size=12),
    texts), min_size=2, max_size=8)


@settings(max_examples=80, deadline=None)
@given(steps, st.sampled_from(["tiny", *TEMPLATES]))
@example([("tool", [40, 41], "a"), ("inject", [300, 5, 900, 17], "b"), ("answer", [9], "c"), ("tool", [7], "d")],
         "tiny")  # the injected turn gets the model's ids only when the model says it: the earlier decision changes
def test_a_resumed_rendering_gives_the_ids_of_the_whole_one(tiny_model: Path, plan: list[tuple[str, list[int], str]],
                                                            template: str) -> None:
    """Whatever the harness does between calls (continue with one or two tool results or a user turn, add a result
    before the model answers, rewrite or drop earlier messages, change its tools, send the same call again, put
    words in the model's mouth that it says later), and whatever the template (local, rendered beside a stub;
    rewriting earlier turns; numbering them; with a clock): the prompt resumed from the previous call's rendering
    is the one rendered from the start."""
    loaded = ChatTokenizer.load(tiny_model, cache_tokens=10_000)
    tokenizer = loaded if template == "tiny" else ChatTokenizer(loaded.backend, TEMPLATES[template],
                                                                loaded.special_tokens, 10_000)
    renderer = Renderer(tokenizer)
    messages: list[Message] = [Message("system", "Answer with the tool."), Message("user", "What is x?")]
    tools: tuple[dict[str, Any], ...] = TOOLS
    turns: dict[str, list[list[int]]] = {}
    state = None
    resumed = 0
    said: list[int] = []  # what the harness made the model say (inject), which it then says itself (answer)
    held: tuple[list[int], list[int]] | None = None  # a prompt whose call is not over, and a copy of it
    for action, ids, text in plan:
        request = ChatRequest(tuple(messages), tools)
        rendered = renderer.render(request, own_turns(request, turns, state), after=state)
        whole = renderer.render(request, own_turns(request, turns), remembered=False)
        assert rendered.prompt_ids == whole.prompt_ids and rendered.text == whole.text
        if held is not None:  # a call still in flight keeps its prompt: the next rendering copied it
            assert held[0] == held[1]
        state, resumed = rendered.state, resumed + rendered.resumed
        assert state is not None
        if len(ids) % 2:  # its call is over (the service releases each): the next rendering may take its ids
            state.release()
            held = None
        else:
            held = (rendered.prompt_ids, list(rendered.prompt_ids))
        generated = said if action == "answer" and said else [*ids, tokenizer.eos_token_id]
        content, calls = HermesParser().parse(tokenizer.decode(generated, skip_special_tokens=True))
        if action == "repeat":
            continue
        if action == "late":  # one more tool result (or a note) before the model answers: the text before it changes
            last = messages[-1]
            messages.append(Message("tool", text, tool_call_id=last.tool_call_id) if last.role == "tool"
                            else Message("user", text or "Also this."))
            continue
        if action == "inject":  # an assistant message the model did not write: its text, until the model writes it
            messages += [Message("assistant", content, tuple(calls)), Message("user", text or "Go on.")]
            said = generated
            continue
        turns.setdefault(message_key(content, calls), []).append(generated)
        messages.append(Message("assistant", content, tuple(calls)))
        if action in ("tool", "two tools"):
            for n in range(1 + (action == "two tools")):
                messages.append(Message("tool", f"{text} {n}", tool_call_id=calls[0].id if calls else "c"))
        elif action == "rewrite":  # context compaction: an earlier message summarised
            messages[1] = Message("user", f"(summary) {text}")
        elif action == "compact":
            messages[2:-1] = []
        elif action == "tools":
            tools = () if tools else TOOLS
        else:
            messages.append(Message("user", text or "Go on."))
    if all(a in ("tool", "user") for a, _, _ in plan[:-1]) and template == "tiny":
        assert resumed == len(plan) - 1  # a plain agent loop resumes on every call after the first


def test_an_agent_loop_resumes_every_call_and_renders_only_the_new_turns(tokenizer: ChatTokenizer,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The cost of a call does not grow with its rollout's turns: the template renders three times, a stub of two
    messages and the two added, and only the assistant message added is keyed, however long the conversation."""
    keyed: list[str] = []

    def counting_key(content: str, calls: Any) -> str:
        keyed.append(content)
        return message_key(content, calls)

    monkeypatch.setattr(render_module, "message_key", counting_key)
    renderer = Renderer(tokenizer)
    assert renderer.stub is not None  # the tiny model's template is local
    rendered: list[int] = []
    original = renderer.template

    def counting(messages: list[dict[str, Any]], *args: Any, **kwargs: Any) -> str:
        rendered.append(len(messages))
        return original(messages, *args, **kwargs)

    renderer.template = counting  # type: ignore[method-assign]
    messages = [Message("system", "Answer with the tool."), Message("user", "What is x?")]
    turns: dict[str, list[list[int]]] = {}
    state = None
    previous: list[int] = []
    for n in range(12):
        request = ChatRequest(tuple(messages), TOOLS)
        rendered.clear()
        keyed.clear()
        looked_up = _Counting(turns)
        result = renderer.render(request, own_turns(request, looked_up, state), after=state)
        # only the turn added since the previous call is keyed and looked up, not every earlier one
        assert len(keyed) == looked_up.gets == min(n, 1)
        whole = Renderer(tokenizer, stub=False).render(request, own_turns(request, turns))
        assert result.prompt_ids == whole.prompt_ids and result.packed == whole.packed
        assert result.resumed == (n > 0) and result.stub == (n > 0) and result.reused_turns == n
        # the whole text once; then the stub, the stub and both added (open), the stub and the answer (closed)
        assert rendered == ([2] if n == 0 else [2, 4, 3])
        if n > 0:  # the previous call is over: its prompt's list was cut and extended in place, not copied
            assert result.prompt_ids is previous
        state, previous = result.state, result.prompt_ids
        assert state is not None
        state.release()
        ids = [*tokenizer.encode(f'<tool_call>\n{{"name": "lookup", "arguments": {{"q": "{n}"}}}}\n</tool_call>'),
               tokenizer.eos_token_id]
        content, calls = HermesParser().parse(tokenizer.decode(ids, skip_special_tokens=True))
        turns.setdefault(message_key(content, calls), []).append(ids)
        messages += [Message("assistant", content, tuple(calls)), Message("tool", f"result {n}", tool_call_id="c")]


class _Counting(dict[str, list[list[int]]]):
    """A rollout's turns that count their look-ups."""

    gets = 0

    def get(self, key: str, default: Any = None) -> Any:
        self.gets += 1
        return super().get(key, default)


def test_the_check_finds_a_prompt_that_is_not_the_whole_rendering(tokenizer: ChatTokenizer) -> None:
    renderer = Renderer(tokenizer)
    request = ChatRequest((Message("system", "Answer with the tool."), Message("user", "What is x?")), TOOLS)
    rendered = renderer.render(request, lambda i: None)
    assert differs(renderer, request, lambda i: None, rendered) is None
    wrong = dataclasses.replace(rendered, prompt_ids=rendered.prompt_ids[:-1])
    whole = differs(renderer, request, lambda i: None, wrong)
    assert whole is not None and whole.prompt_ids == rendered.prompt_ids
