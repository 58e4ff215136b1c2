"""The page's pure parts: advantages as the trainer's default, each API's conversation and answer, the charts, the
tokens' text."""

from __future__ import annotations

import re
import statistics
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from analytics.view.charts import Series, chart
from analytics.view.pages import reward_series, run_charts
from analytics.view.reads import Curves, advantages, answer_of, conversation, validation_curves
from analytics.view.tokens import token_texts


@given(st.lists(st.one_of(st.none(), st.floats(-10, 10, allow_nan=False)), min_size=1, max_size=8))
def test_advantages_are_centred_and_scaled_over_the_rewarded(rewards: list[float | None]) -> None:
    got = advantages(rewards)
    assert [g is None for g in got] == [r is None for r in rewards]
    known = [g for g in got if g is not None]
    rewarded = [r for r in rewards if r is not None]
    if len(rewarded) >= 2 and max(rewarded) - min(rewarded) > 1e-12:  # verl's GRPO: over the sample std + 1e-6
        assert abs(statistics.fmean(known)) < 1e-6
        spread = statistics.stdev(rewarded)
        assert abs(statistics.stdev(known) - spread / (spread + 1e-6)) < 1e-6
    else:  # no signal: nothing to learn
        assert all(g == 0.0 for g in known)


def test_each_api_gives_its_messages_tools_text_and_tool_calls() -> None:
    chat = {"choices": [{"message": {"content": "hi", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "look", "arguments": "{\"x\": 1}"}}]}}]}
    assert answer_of("openai.chat", chat) == ("hi", [{"name": "look", "arguments": "{\"x\": 1}"}])
    anthropic = {"content": [{"type": "text", "text": "ok"}, {"type": "tool_use", "name": "bash", "input": {"c": 1}}]}
    assert answer_of("anthropic.messages", anthropic) == ("ok", [{"name": "bash", "arguments": {"c": 1}}])
    responses = {"output": [{"type": "message", "content": [{"type": "output_text", "text": "done"}]},
                            {"type": "function_call", "name": "shell", "arguments": "{}"}]}
    assert answer_of("openai.responses", responses) == ("done", [{"name": "shell", "arguments": "{}"}])
    assert answer_of("openai.completions", {"choices": [{"text": "abc"}]}) == ("abc", [])

    messages, tools = conversation("anthropic.messages", {"system": "be brief", "messages": [
        {"role": "user", "content": "q"}], "tools": [{"name": "bash"}]})
    assert [m["role"] for m in messages] == ["system", "user"] and tools == ["bash"]
    messages, tools = conversation("openai.responses", {"instructions": "sys", "input": "do it",
                                                        "tools": [{"type": "function", "name": "shell"}]})
    assert messages == [{"role": "system", "content": "sys"}, {"role": "user", "content": "do it"}]
    assert tools == ["shell"]
    messages, tools = conversation("openai.chat", {"messages": [{"role": "user", "content": "q"}], "tools": [
        {"type": "function", "function": {"name": "look"}}]})
    assert messages == [{"role": "user", "content": "q"}] and tools == ["look"]


def test_a_chart_has_a_point_per_value_with_its_value_on_hover_and_escapes_names() -> None:
    svg = chart("reward <by> version", [Series("mean", [(0, 0.5), (1, 0.75), (2, 1.0)], spread=[0.1, 0.2, 0.0])],
                "version", "reward")
    assert svg.count("<circle") == 3 and "<polygon" in svg
    assert "mean at 1: 0.75 ± 0.2" in svg and "reward &lt;by&gt; version" in svg and "<by>" not in svg
    assert re.findall(r'class="tick" text-anchor="middle">([^<]+)<', svg) == ["0", "1", "2"]  # whole versions
    assert "no data yet" in chart("empty", [Series("x", [])], "x", "y")
    bars = chart("calls", [Series("rollouts", [(1, 3.0), (2, 5.0)], bars=True)], "calls", "rollouts")
    assert bars.count("<rect") == 2


def test_validation_rows_become_a_curve_per_setting_in_version_order() -> None:
    rows = [{"version": 4, "setting": "greedy", "mean_reward": 0.5}, {"version": 0, "setting": "harness",
                                                                     "mean_reward": 0.1},
            {"version": 0, "setting": "greedy", "mean_reward": 0.25}, {"version": 4, "setting": "harness",
                                                                       "mean_reward": 0.0}]
    assert validation_curves(rows) == {"greedy": [(0.0, 0.25), (4.0, 0.5)], "harness": [(0.0, 0.1), (4.0, 0.0)]}
    assert validation_curves([]) == {}


def curves(validation: dict[str, list[tuple[float, float]]]) -> Curves:
    return Curves(reward_by_update=[], loss_by_update=[], tokens_by_update=[],
                  reward_by_version=[(0, 0.5, 0.1), (1, 0.6, 0.2), (2, 0.7, 0.1)], rollouts_by_version=[],
                  calls_per_rollout=[], latency=[], validation_by_version=validation)


def test_validation_is_drawn_dashed_per_setting_beside_training_reward_on_its_versions() -> None:
    validation = {"greedy": [(0.0, 0.2), (2.0, 0.8)], "t=0.7": [(0.0, 0.1), (2.0, 0.6)]}
    series = reward_series(curves(validation))
    assert [s.name for s in series] == ["training", "validation: greedy", "validation: t=0.7"]
    assert [s.dashed for s in series] == [False, True, True] and len({s.colour for s in series}) == 3
    assert [list(s.points) for s in series[1:]] == list(validation.values())
    svg = run_charts(curves(validation))[1]
    assert 'data-chart="reward by sampling weight version (± spread)"' in svg
    assert svg.count("stroke-dasharray") == 2 and svg.count("<circle") == 3 + 4
    assert "validation: t=0.7 at 2: 0.6" in svg and "training at 1: 0.6 ± 0.2" in svg
    ticks = re.findall(r'class="tick" text-anchor="middle">([^<]+)<', svg)
    assert ticks == ["0", "1", "2"]  # one axis of weight versions for both


def test_without_validation_the_reward_chart_is_the_training_curve_alone() -> None:
    series = reward_series(curves({}))
    assert [s.name for s in series] == ["training"]
    svg = run_charts(curves({}))[1]
    assert "legend" not in svg and "stroke-dasharray" not in svg and "validation" not in svg


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(tiny_model)


def test_a_character_split_over_tokens_shows_whole_on_the_first(tokenizer: PreTrainedTokenizerBase) -> None:
    ids = tokenizer.encode("café 🙂", add_special_tokens=False)
    alone = [tokenizer.decode([i]) for i in ids]
    assert alone.count("\ufffd") >= 5  # the byte-level tokenizer splits é in two and the emoji in four
    texts = token_texts(ids, lambda part: str(tokenizer.decode(part)))
    assert len(texts) == len(ids) and "".join(texts) == "café 🙂"
    assert "é" in texts and "🙂" in texts and "\ufffd" not in "".join(texts)


@given(text=st.text(max_size=40))
def test_the_tokens_text_reads_as_the_whole_decoded(tokenizer: PreTrainedTokenizerBase, text: str) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    texts = token_texts(ids, lambda part: str(tokenizer.decode(part)))
    assert len(texts) == len(ids) and "".join(texts) == tokenizer.decode(ids)
