"""The tiny model's preparation: the copying rows it learns induction from, and the warm-start's episodes."""

from __future__ import annotations

import json
import random
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st
from transformers import AutoTokenizer

from tether.copying import NOT_SCORED, induction_row
from tether.modules import load_file
from tether.warm_start import episode_row, letter_turns, transcript

ROOT = Path(__file__).parent.parent


AGENT = load_file(ROOT / "examples" / "openai_agent.py")
LOOKUP = load_file(ROOT / "examples" / "lookup_task.py")


@given(st.integers(0, 2**32), st.integers(20, 200))
def test_every_scored_token_follows_a_pair_seen_earlier(seed: int, length: int) -> None:
    """What makes it induction: a scored token and the one before it appeared together earlier in the row."""
    tokens, labels = induction_row(random.Random(seed), 2048, length)
    assert len(tokens) == len(labels) == length
    assert all(3 <= t < 2048 for t in tokens)
    for i, label in enumerate(labels):
        if label == NOT_SCORED:
            continue
        assert label == tokens[i]
        assert any(tokens[j - 1] == tokens[i - 1] and tokens[j] == tokens[i] for j in range(1, i - 1)), i


def test_repeats_stand_at_many_distances_so_position_alone_cannot_predict_them() -> None:
    rng = random.Random(0)
    distances = set()
    for _ in range(32):
        tokens, labels = induction_row(rng, 2048, 128)
        for i, label in enumerate(labels):
            if label != NOT_SCORED:
                distances |= {i - j for j in range(i) if tokens[j] == tokens[i] and tokens[j - 1] == tokens[i - 1]}
    assert len(distances) > 50
    scored = sum(label != NOT_SCORED for _ in range(32) for label in induction_row(rng, 2048, 128)[1])
    assert scored > 32 * 20  # a good share of each row teaches something


def test_a_one_call_episode_is_the_transcript_the_gateway_renders(tiny_model: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    episode = letter_turns(random.Random(3))
    prompt, call = transcript(tokenizer, AGENT.SYSTEM, AGENT.TOOLS, episode[0])
    tokens, labels = episode_row(tokenizer, AGENT.SYSTEM, AGENT.TOOLS, episode)
    assert tokens == prompt + call
    assert labels == [NOT_SCORED] * len(prompt) + call


@given(st.integers(0, 2**32))
def test_every_call_of_a_lookup_episode_is_scored_where_it_stands(tiny_model: Path, seed: int) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    rng = random.Random(seed)
    episode = LOOKUP.random_turns(rng, LOOKUP.task(rng, 0), 6)
    tokens, labels = episode_row(tokenizer, AGENT.SYSTEM, AGENT.TOOLS, episode)
    spans: list[list[int]] = []
    for i, label in enumerate(labels):
        if label != NOT_SCORED:
            assert label == tokens[i]
            if i == 0 or labels[i - 1] == NOT_SCORED:
                spans.append([])
            spans[-1].append(label)
    texts = [str(tokenizer.decode(span, skip_special_tokens=False)) for span in spans]
    assert len(texts) == len(episode)
    for text, (_, call) in zip(texts, episode, strict=True):
        body = text.removeprefix("<tool_call>\n").removesuffix("\n</tool_call><|im_end|>")
        assert json.loads(body) == call, text
