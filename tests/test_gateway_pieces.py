"""The tokenizer's cache of pieces gives the tokenizer's own ids, whatever the text, and stays within its bound."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer

from gateway.pieces import PieceCache
from gateway.tokenizer import ChatTokenizer

SPECIALS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")
# pieces that could merge with their neighbours were they tokenised together: spaces, newlines, combining marks,
# the normalised added tokens (<tool_call>), the start of a special token without its end
text_pieces = st.one_of(
    st.text(st.characters(codec="utf-8"), max_size=30),
    st.sampled_from([" ", "\n", "  \n", "\u0301", "e\u0301", "<tool_call>", "</tool_call>", "<|im_", "|>", "system\n"]),
)
long_pieces = st.builds(lambda words, n: " ".join(words) * n, st.lists(st.sampled_from(["def", "x", "é", "\n"]),
                                                                        min_size=1, max_size=5), st.integers(40, 80))
texts = st.lists(st.one_of(st.sampled_from(SPECIALS), text_pieces, long_pieces), max_size=12).map("".join)


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path) -> ChatTokenizer:
    return ChatTokenizer.load(tiny_model, cache_tokens=5_000)


@settings(max_examples=150)
@given(st.lists(texts, min_size=1, max_size=4))
def test_pieces_give_the_tokenizers_own_ids(tokenizer: ChatTokenizer, calls: list[str]) -> None:
    assert tokenizer.pieces.enabled
    for text in calls + calls:  # the second time from what was remembered
        assert tokenizer.encode(text) == tokenizer.encode_whole(text)
    assert tokenizer.pieces.tokens <= tokenizer.pieces.max_tokens


def test_a_long_piece_seen_before_is_not_tokenised_again(tiny_model: Path) -> None:
    tokenizer = ChatTokenizer.load(tiny_model, cache_tokens=100_000)
    system = "<|im_start|>system\n" + "You are a careful agent. " * 200 + "<|im_end|>\n"
    first = tokenizer.encode(system + "<|im_start|>user\nhi<|im_end|>\n")
    misses = tokenizer.pieces.misses
    second = tokenizer.encode(system + "<|im_start|>user\nbye<|im_end|>\n")
    assert tokenizer.pieces.misses == misses and tokenizer.pieces.hits == 1
    assert first[:len(tokenizer.encode_whole(system))] == second[:len(tokenizer.encode_whole(system))]


def test_the_least_recently_used_pieces_go_first(tiny_model: Path) -> None:
    tokenizer = ChatTokenizer.load(tiny_model, cache_tokens=1_000)
    pieces = [f"<|im_start|>{word * 300}<|im_end|>" for word in ("a", "b", "c", "d", "e")]
    for p in pieces:
        tokenizer.encode(p)
    assert 0 < tokenizer.pieces.tokens <= 1_000
    hits = tokenizer.pieces.hits
    tokenizer.encode(pieces[-1])
    assert tokenizer.pieces.hits == hits + 1
    tokenizer.encode(pieces[0])
    assert tokenizer.pieces.hits == hits + 1  # long gone


@pytest.mark.parametrize("strips", [{"lstrip": True}, {"rstrip": True}, {"single_word": True}])
def test_no_cache_where_a_special_token_takes_its_neighbours(tiny_model: Path, strips: dict[str, bool]) -> None:
    """Such a token's match depends on the text beside it, so cutting there need not give the tokenizer's ids."""
    backend = Tokenizer.from_file(str(tiny_model / "tokenizer.json"))
    backend.add_special_tokens([AddedToken("<|sep|>", normalized=False, **strips)])
    assert not PieceCache(backend, 1_000).enabled


def test_no_cache_where_the_first_piece_of_a_text_is_tokenised_unlike_the_others(tiny_model: Path) -> None:
    """A Metaspace pre-tokenizer that prepends its space to the first piece only (Llama 2's, Mistral's): the probe
    finds it out. (Its space is `Ġ` here, which this vocabulary has.)"""
    from tokenizers import pre_tokenizers

    backend = Tokenizer.from_file(str(tiny_model / "tokenizer.json"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="Ġ", prepend_scheme="first")
    cache = PieceCache(backend, 1_000)
    assert not cache.enabled
    text = "<|im_start|>" + "hello world " * 40 + "<|im_end|> tail"
    assert cache.encode(text) == backend.encode(text, add_special_tokens=False).ids
