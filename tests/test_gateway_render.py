"""Prompts extend each other across turns: the model's own turns come back as the ids it produced."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from gateway.chat import ChatRequest, Message, ToolCall, message_key
from gateway.render import Renderer, own_turns
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
