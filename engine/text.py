"""Incremental detokenisation of one generated sequence, with stop strings found, held back and cut."""

from __future__ import annotations

from collections.abc import Callable

from transformers import PreTrainedTokenizerBase


class TextStream:
    """Text of the tokens generated so far; a stream never shows a stop string or half of a character."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, stop: list[str]) -> None:
        self._tokenizer = tokenizer
        self._stop = [s for s in stop if s]
        self._hold = max((len(s) for s in self._stop), default=1) - 1
        self.ids: list[int] = []
        self.text = ""
        self.offsets: list[int] = []  # where each token's text starts
        self.stop_reason: str | None = None
        self._sent = 0
        self._prefix = self._read = 0
        backend = getattr(tokenizer, "backend_tokenizer", None)  # the Rust tokenizer, without Python overhead

        def decode(ids: list[int]) -> str:
            if backend is not None:
                return str(backend.decode(ids, skip_special_tokens=True))
            return str(tokenizer.decode(ids, skip_special_tokens=True))

        self._decode: Callable[[list[int]], str] = decode

    def push(self, token_id: int) -> bool:
        """Add a token; True when a stop string now ends the text (which is cut before it)."""
        self.offsets.append(len(self.text))
        self.ids.append(token_id)
        # Decode only a window: the text of ids[prefix:] minus that of ids[prefix:read] is what is new.
        # Decoding from a few tokens back keeps byte-level merges and spaces right.
        new = self._decode(self.ids[self._prefix:])
        if new.endswith("\ufffd"):  # a multi-byte character is not complete yet
            return False
        old = self._decode(self.ids[self._prefix:self._read])
        searched_from = max(0, len(self.text) - self._hold)
        decoded = self.text + new[len(old):]
        self._prefix, self._read = self._read, len(self.ids)
        self.text = decoded
        hits = [(at, stop) for stop in self._stop if (at := decoded.find(stop, searched_from)) >= 0]
        if hits:
            at, self.stop_reason = min(hits)
            self.text = decoded[:at]
        return self.stop_reason is not None

    def finish(self) -> None:
        if self.stop_reason is None:
            self.text = self._decode(self.ids)

    def delta(self, final: bool = False) -> str:
        """Text not yet sent; a tail that could still become a stop string waits unless final."""
        end = len(self.text) if final or self.stop_reason else max(self._sent, len(self.text) - self._hold)
        out = self.text[self._sent:end]
        self._sent = end
        return out
