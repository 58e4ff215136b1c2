"""The running batch's KV cache: one left-padded tensor pair per layer, rows joining and leaving every step.

Each sequence is prefilled alone (no padding inside a prompt), then its cache
is left-padded with zeros to the batch's width. Padding columns are masked
out of attention and positions are per row, so each row computes exactly
what it would alone; that is what lets sequences join mid-flight.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values of shape [B, heads, width, dim]


def cache_tensors(cache: DynamicCache) -> KV:
    layers = cast(list[DynamicLayer], cache.layers)
    kv = [(layer.keys, layer.values) for layer in layers]
    assert all(k is not None and v is not None for k, v in kv), "cache has uninitialised layers"
    return cast(KV, kv)


def _left_pad(kv: KV, width: int) -> KV:
    pad = width - kv[0][0].shape[2]
    if pad == 0:
        return kv
    return [(F.pad(k, (0, 0, pad, 0)), F.pad(v, (0, 0, pad, 0))) for k, v in kv]


class KVBatch:
    def __init__(self) -> None:
        self.cache: DynamicCache | None = None  # kept across steps; rebuilt only when rows join or leave
        self.lengths: list[int] = []  # real (unpadded) positions of each row

    @property
    def kv(self) -> KV:
        return cache_tensors(self.cache) if self.cache is not None else []

    @property
    def width(self) -> int:
        kv = self.kv
        return kv[0][0].shape[2] if kv else 0

    def __len__(self) -> int:
        return len(self.lengths)

    def add(self, rows: list[tuple[KV, int]]) -> None:
        """Append prefilled sequences (each a batch-of-one cache and its length) as new rows."""
        if not rows:
            return
        current = self.kv
        width = max([self.width, *(n for _, n in rows)])
        parts = ([_left_pad(current, width)] if current else []) + [_left_pad(kv, width) for kv, _ in rows]
        self._set([
            (torch.cat([p[i][0] for p in parts]), torch.cat([p[i][1] for p in parts])) for i in range(len(parts[0]))
        ])
        self.lengths += [n for _, n in rows]

    def keep(self, rows: list[int]) -> None:
        """Drop every other row, then the leading columns that are padding for all remaining rows."""
        if not rows:
            self.cache, self.lengths = None, []
            return
        kv = self.kv
        self.lengths = [self.lengths[i] for i in rows]
        trim = kv[0][0].shape[2] - max(self.lengths)
        index = torch.tensor(rows, device=kv[0][0].device)
        self._set([(k.index_select(0, index)[:, :, trim:], v.index_select(0, index)[:, :, trim:]) for k, v in kv])

    def step_inputs(self, device: torch.device) -> tuple[DynamicCache, torch.Tensor, torch.Tensor]:
        """Cache, attention mask [B, width+1] and position ids [B, 1] for feeding one new token per row."""
        assert self.cache is not None, "no running rows"
        width = self.cache.get_seq_length()
        lengths = torch.tensor(self.lengths, device=device)
        columns = torch.arange(width + 1, device=device)
        mask = (columns[None, :] >= (width - lengths)[:, None]).long()
        return self.cache, mask, lengths[:, None]

    def advance(self, cache: DynamicCache) -> None:
        """Take the cache a step returned: every row grew by one position."""
        self.cache = cache
        self.lengths = [n + 1 for n in self.lengths]

    def _set(self, kv: KV) -> None:
        self.cache = DynamicCache(ddp_cache_data=kv)
