"""Response tokens as text a reader can see.

A byte-level tokenizer splits a character of several UTF-8 bytes (é, 日, an emoji) over several tokens, and each
of them decoded alone is U+FFFD. The character is shown on the first token of its run instead, and the others of
the run as empty text: every token keeps its own logprob and hover, and the text reads as the model wrote it."""

from __future__ import annotations

from collections.abc import Callable

_REPLACEMENT = "\ufffd"
_LONGEST_RUN = 8  # tokens one character may take (4 UTF-8 bytes; merges across characters can add a few)


def token_texts(token_ids: list[int], decode: Callable[[list[int]], str]) -> list[str]:
    """One text per token; their concatenation is `decode(token_ids)` wherever whole characters are decodable."""
    texts: list[str] = []
    start = 0
    while start < len(token_ids):
        end, text = start + 1, decode(token_ids[start:start + 1])
        if _REPLACEMENT in text:
            for longer in range(start + 2, min(start + _LONGEST_RUN, len(token_ids)) + 1):
                whole = decode(token_ids[start:longer])
                if _REPLACEMENT not in whole:
                    end, text = longer, whole
                    break
        texts += [text, *[""] * (end - start - 1)]
        start = end
    return texts
