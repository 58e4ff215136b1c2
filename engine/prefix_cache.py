"""Key/value caches of recent prompts, so a prompt that starts like one of them prefills only the rest.

An agent's calls repeat the conversation so far, and every rollout of a
harness opens with the same long system prompt and tool list (Claude Code's
is about 27 thousand tokens of the tiny tokenizer). Prefill is quadratic in
the prompt: on two CPU cores 28k tokens take about 9 s, so recomputing what
the previous call already computed would dominate a rollout. Entries hold a
prompt's ids and its cache; the longest shared prefix is reused. Entries are
valid for one weight version only (the engine clears the cache on a weight
change), and are bounded in bytes, least recently used dropped first.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

from engine.kv_batch import KV

MIN_REUSE = 32  # a shorter shared prefix is not worth building a cache for


@dataclass(frozen=True)
class _Entry:
    ids: torch.Tensor  # [length] int64
    kv: KV  # per layer [1, heads, length, dim]
    nbytes: int


def shared_prefix(a: torch.Tensor, b: torch.Tensor) -> int:
    """How many leading ids two 1-d tensors have in common."""
    n = min(len(a), len(b))
    differ = (a[:n] != b[:n]).nonzero()
    return int(differ[0]) if len(differ) else n


class PrefixCache:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # least recently used first
        self._next = 0
        self.bytes = 0
        self.hits = 0
        self.reused_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def longest(self, ids: list[int]) -> tuple[int, KV]:
        """The cache of the longest stored prefix of `ids` (at most all but the last id: its logits are
        still needed), cut to that length; (0, []) when none reaches MIN_REUSE."""
        if not self._entries:
            return 0, []
        query = torch.tensor(ids[:-1])
        best, key = 0, -1
        for k, entry in self._entries.items():
            n = shared_prefix(query, entry.ids)
            if n > best:
                best, key = n, k
        if best < MIN_REUSE:
            return 0, []
        self._entries.move_to_end(key)
        self.hits += 1
        self.reused_tokens += best
        return best, [(k[:, :, :best], v[:, :, :best]) for k, v in self._entries[key].kv]

    def put(self, ids: list[int], kv: KV) -> None:
        """Keep the cache of a whole prompt (batch of one); entries it extends are dropped as redundant."""
        nbytes = sum(k.nbytes + v.nbytes for k, v in kv)
        if nbytes > self.max_bytes or len(ids) < MIN_REUSE:
            return
        new = torch.tensor(ids)
        for k in [k for k, e in self._entries.items() if shared_prefix(new, e.ids) == len(e.ids)]:
            self._drop(k)
        while self._entries and self.bytes + nbytes > self.max_bytes:
            self._drop(next(iter(self._entries)))
        self._entries[self._next] = _Entry(new, kv, nbytes)
        self._next += 1
        self.bytes += nbytes

    def clear(self) -> None:
        self._entries.clear()
        self.bytes = 0

    def _drop(self, key: int) -> None:
        self.bytes -= self._entries.pop(key).nbytes
