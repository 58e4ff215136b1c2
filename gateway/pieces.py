"""Encoding a conversation by its pieces, each long piece remembered.

A harness resends its whole conversation on every call, and a harness's
rollouts share their long system prompt and tool list, so almost every
character a gateway tokenises it has tokenised before. Hugging Face
tokenizers cut a text at the added tokens matched unnormalised (a chat
template's `<|im_start|>`, `<|im_end|>`) before normalising and
pre-tokenising each piece on its own, so the ids of a text are the ids of its
pieces in order: the pieces between special tokens (a message each, in a chat
format) can be encoded once and looked up after, which makes a call's
tokenising cost that of its new text.

Where that cut does not hold (an added token that strips the spaces beside it
or matches whole words only, a pre-tokenizer that treats the first piece of a
text unlike the others) the cache is off: `PieceCache.exact` probes it once
when it is built.
"""

from __future__ import annotations

import itertools
import re
from array import array
from collections import OrderedDict

from tokenizers import Tokenizer

#: texts the probe cuts at special tokens: leading spaces, pieces that are only spaces or newlines, unicode that
#: normalisation could join across a cut, a special token at either end and two in a row
_PROBES = (" hello world", "  leading\n", "\n\n", "e\u0301 caf\u00e9 \u212b", "x", " ", "\t tab", "123 456")


class PieceCache:
    """`encode(text)` equal to the tokenizer's own, with pieces of `min_chars` or more remembered (least recently
    used first out, at most `max_tokens` ids in all)."""

    def __init__(self, backend: Tokenizer, max_tokens: int, min_chars: int = 256) -> None:
        self.backend = backend
        self.max_tokens = max_tokens
        self.min_chars = min_chars
        self.tokens = 0  # ids held
        self.hits = 0
        self.misses = 0
        self._pieces: OrderedDict[str, array[int]] = OrderedDict()
        added = backend.get_added_tokens_decoder().values()
        self.specials = sorted({t.content for t in added if not t.normalized and t.content}, key=len, reverse=True)
        strips = any(t.lstrip or t.rstrip or t.single_word for t in added if not t.normalized)
        # longest first: at each position the longest special token, as the tokenizer matches them
        self._cut = (re.compile("(" + "|".join(map(re.escape, self.specials)) + ")")
                     if self.specials and not strips else None)
        self.enabled = max_tokens > 0 and self._cut is not None and self.exact()

    def _whole(self, text: str) -> list[int]:
        return list(self.backend.encode(text, add_special_tokens=False).ids)

    def exact(self) -> bool:
        """Whether cutting at the special tokens gives the tokenizer's own ids, on the probes."""
        texts = [s.join(pair) for s in self.specials for pair in itertools.pairwise(_PROBES)]
        texts += [s + p + s + s + p for s in self.specials for p in _PROBES]
        return all(self._by_pieces(t, min_chars=0, remember=False) == self._whole(t) for t in texts)

    def encode(self, text: str) -> list[int]:
        if not self.enabled or len(text) < self.min_chars:
            return self._whole(text)
        return self._by_pieces(text, self.min_chars, remember=True)

    def _by_pieces(self, text: str, min_chars: int, remember: bool) -> list[int]:
        """Pieces shorter than `min_chars` that follow each other are encoded together, in one call."""
        assert self._cut is not None
        ids: list[int] = []
        short: list[str] = []
        for piece in self._cut.split(text):
            if not piece:
                continue
            if len(piece) < min_chars:
                short.append(piece)
                continue
            if short:
                ids += self._whole("".join(short))
                short.clear()
            found = self._pieces.get(piece)
            if found is not None:
                self.hits += 1
                self._pieces.move_to_end(piece)
                ids += found
                continue
            self.misses += 1
            encoded = self._whole(piece)
            ids += encoded
            if remember:
                self._remember(piece, array("i", encoded))
        if short:
            ids += self._whole("".join(short))
        return ids

    def _remember(self, piece: str, encoded: array[int]) -> None:
        if len(encoded) > self.max_tokens:
            return
        self._pieces[piece] = encoded
        self.tokens += len(encoded)
        while self.tokens > self.max_tokens:
            _, dropped = self._pieces.popitem(last=False)
            self.tokens -= len(dropped)
