"""Prompts extend each other across turns: the model's own turns come back as the ids it produced."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from gateway.chat import ChatRequest, Message, ToolCall, message_key
from gateway.render import Renderer
from gateway.tool_parsers import HermesParser

TOOLS = ({"type": "function", "function": {"name": "lookup", "description": "Look a word up.",
                                           "parameters": {"type": "object",
                                                          "properties": {"q": {"type": "string"}}}}},)


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(tiny_model)


class Harness:
    """A non-compacting agent loop: it sends back every turn as it received it (tool call JSON re-serialised)."""

    def __init__(self, renderer: Renderer) -> None:
        self.renderer = renderer
        self.messages: list[Message] = [Message("system", "Answer with the tool."), Message("user", "What is x?")]
        self.turns: dict[str, list[int]] = {}
        self.calls: list[tuple[list[int], list[int]]] = []

    def call(self, generated_ids: list[int]) -> None:
        request = ChatRequest(tuple(self.messages), TOOLS)

        def generated(i: int) -> list[int] | None:
            m = request.messages[i]
            return self.turns.get(message_key(m.content, m.tool_calls))

        prompt = self.renderer.render(request, generated).prompt_ids
        self.calls.append((prompt, generated_ids))
        text = str(self.renderer.tokenizer.decode(generated_ids, skip_special_tokens=True))
        content, calls = HermesParser().parse(text)
        self.turns[message_key(content, calls)] = generated_ids
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


def test_tool_turns_are_reused_exactly(tokenizer: PreTrainedTokenizerBase) -> None:
    renderer = Renderer(tokenizer)
    harness = Harness(renderer)
    im_end = int(tokenizer.convert_tokens_to_ids("<|im_end|>"))  # type: ignore[arg-type]
    for q in ("x", "y z", "w"):
        text = f'<tool_call>\n{{"name": "lookup", "arguments": {{"q":   "{q}"}}}}\n</tool_call>'
        harness.call(tokenizer(text, add_special_tokens=False)["input_ids"] + [im_end])
    harness.call(tokenizer("It is 42.", add_special_tokens=False)["input_ids"] + [im_end])
    assert extends(harness.calls)


@settings(max_examples=40)
@given(st.lists(st.lists(st.integers(3, 2047), min_size=1, max_size=30), min_size=2, max_size=5))
def test_any_generated_ids_come_back_unchanged(tokenizer: PreTrainedTokenizerBase, turns: list[list[int]]) -> None:
    """Even ids whose text re-tokenises differently (a random model writes such things)."""
    renderer = Renderer(tokenizer)
    harness = Harness(renderer)
    im_end = int(tokenizer.convert_tokens_to_ids("<|im_end|>"))  # type: ignore[arg-type]
    for ids in turns:
        harness.call([*ids, im_end])
    assert extends(harness.calls)


def test_without_reuse_text_is_rendered_by_the_template(tokenizer: PreTrainedTokenizerBase) -> None:
    renderer = Renderer(tokenizer)
    request = ChatRequest((Message("user", "hi"), Message("assistant", "hello"), Message("user", "bye")))
    rendered = renderer.render(request, lambda i: None)
    assert rendered.reused_turns == 0
    assert rendered.prompt_ids == tokenizer(rendered.text, add_special_tokens=False)["input_ids"]
    assert rendered.text.endswith("<|im_start|>assistant\n")


def test_a_call_needs_a_name_and_an_object_of_arguments() -> None:
    parser = HermesParser()
    content, calls = parser.parse('<tool_call>\n{"name": "run", "arguments": "ls -la"}\n</tool_call>')
    assert calls == [] and "ls -la" in content  # not a well-formed call: the harness sees the text
    content, calls = parser.parse('Let me look.\n<tool_call>\n{"name": "lookup", "arguments": {"q": "x"}}\n'
                                  '</tool_call>')
    assert content == "Let me look." and [(c.name, json.loads(c.arguments)) for c in calls] == [("lookup", {"q": "x"})]
