"""Engine chunks → choices: the same ids, logprobs and alternatives whichever way the engine carries the ids."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.adapters import token_fields
from gateway.choices import Choices
from gateway.errors import EngineFailed


def text_of(token_id: int) -> str:
    return f"<{token_id}>"


ids_ = st.lists(st.integers(0, 200_000), max_size=12)
tops_ = st.lists(st.dictionaries(st.integers(0, 200_000), st.floats(-50, 0), max_size=3), max_size=12)


def chunks(ids: list[int], tops: list[dict[int, float]], cut: int, by_name: bool) -> list[dict[str, Any]]:
    """One choice's answer in two chunks split at `cut`, its ids as `token_ids` or named in the logprobs."""
    out = []
    for part, part_tops in ((ids[:cut], tops[:cut]), (ids[cut:], tops[cut:])):
        named = [f"token_id:{t}" for t in part] if by_name else [text_of(t) for t in part]
        choice: dict[str, Any] = {
            "index": 0, "text": "".join(text_of(t) for t in part),
            "logprobs": {"tokens": named, "token_logprobs": [-0.5] * len(part),
                         "top_logprobs": [{f"token_id:{k}" if by_name else text_of(k): v for k, v in top.items()}
                                          for top in part_tops]}}
        out.append(choice if by_name else {**choice, "token_ids": part})
    out[-1]["finish_reason"] = "stop"
    return [{"choices": [c]} for c in out]


@given(ids_, tops_, st.integers(0, 12))
def test_ids_named_in_the_logprobs_read_as_the_ids_sent_whole(ids: list[int], tops: list[dict[int, float]],
                                                             cut: int) -> None:
    read = []
    for by_name in (False, True):
        choices = Choices(1, "<tool_call>", text_of)
        for chunk in chunks(ids, tops, cut, by_name):
            choices.add(chunk)
        read.append((choices.ids[0], choices.logprobs[0], choices.tops[0], choices.text[0]))
    assert read[0] == read[1]
    assert read[1][0] == ids


@pytest.mark.parametrize("tokens", [["hello"], ["token_id:"], ["token_id:-3"], ["token_id:１２"], [7], None])
def test_an_answer_without_ids_is_the_engines_failure_not_an_empty_turn(tokens: list[Any] | None) -> None:
    """An engine that ignored the flag (tokens named by their text), or sent none at all, is named as the cause:
    a turn recorded without its ids could never be trained on or extended."""
    choices = Choices(1, "<tool_call>", text_of)
    with pytest.raises(EngineFailed, match="no token ids"):
        choices.add({"choices": [{"index": 0, "text": "hello", "logprobs": {"tokens": tokens}}]})


def test_a_chunk_that_adds_nothing_adds_no_ids() -> None:
    choices = Choices(1, "<tool_call>", text_of)
    choices.add({"choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": "length"}]})
    assert choices.ids[0] == [] and choices.finish_reasons[0] == "length"


def test_each_engine_kind_is_asked_for_ids_it_can_give() -> None:
    """vLLM and the embedded engine name the ids in the logprobs (no prompt ids come back); SGLang's OpenAI
    routes have no such flag and are asked for `token_ids`."""
    assert token_fields("vllm") == token_fields("tether") == {"return_tokens_as_token_ids": True}
    assert token_fields("sglang") == {"return_token_ids": True}
