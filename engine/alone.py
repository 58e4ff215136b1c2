"""The deterministic mode's forward passes: one prompt or one sequence per forward, in shapes that depend on it
alone.

Batched kernels pick their blocking by the batch's shape, left padding changes
the width attention reduces over, and a cached prefix changes the shapes the
rest of a prompt is computed in; so in the normal mode a row's numbers move
with its neighbours, the padding and the cache. Here a prompt is prefilled in
chunks that start at fixed positions (multiples of CHUNK), a cached prefix is
reused only up to a chunk boundary (those keys and values are exactly what the
prompt computes alone), and a sequence's decode step covers exactly its own
positions.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedModel

from engine.forward import decode_logits
from engine.kv_batch import KV, cache_tensors

CHUNK = 256  # prompts are prefilled in chunks of this many ids, at multiples of it


def prefill(model: PreTrainedModel, ids: list[int], cached: tuple[int, KV], device: torch.device
            ) -> tuple[KV, torch.Tensor]:
    """The prompt's keys and values and its last position's logits [1, V]; `cached`: the longest stored prefix
    (its length and cache), of which whole chunks are reused."""
    reused, prefix = cached
    reused -= reused % CHUNK
    cache = DynamicCache(ddp_cache_data=[(k[:, :, :reused], v[:, :, :reused]) for k, v in prefix]) \
        if reused else DynamicCache()
    logits = None
    for start in range(reused, len(ids), CHUNK):
        out = model(input_ids=torch.tensor([ids[start:start + CHUNK]], device=device), past_key_values=cache,
                    use_cache=True, logits_to_keep=1)
        cache, logits = out.past_key_values, out.logits[:, -1, :]
    assert logits is not None, "a prompt always has ids past its reused prefix (the last one's logits are needed)"
    return cache_tensors(cache), logits


def decode(model: PreTrainedModel, token: int, cache: DynamicCache, length: int, device: torch.device,
           direct: bool) -> torch.Tensor:
    """One sequence's next-token logits [1, V]; `cache` (its own, `length` positions) grows by one."""
    mask = torch.ones(1, length + 1, dtype=torch.long, device=device)
    return decode_logits(model, torch.tensor([[token]], device=device), mask, torch.tensor([[length]], device=device),
                         cache, direct)
