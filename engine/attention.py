"""Attention for decode steps of a batch with grouped-query heads, registered with transformers as "tether".

SDPA on CPU with a padding mask first copies every key/value head once per
query head (repeat_kv), which at batch 32 costs a third of a decode step. With
one query position the grouped computation needs no copy: a query group
attends to its shared key/value head directly. Everything else (prefill,
training forwards) goes to transformers' SDPA unchanged.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "tether"


def grouped_decode_attention(
    module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None, **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    if query.shape[2] != 1 or module.training:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    batch, heads, _, dim = query.shape
    groups = query.view(batch, key.shape[1], heads // key.shape[1], dim)  # [B, kv_heads, per_group, D]
    scores = torch.matmul(groups, key.transpose(-1, -2)) * (scaling if scaling is not None else dim**-0.5)
    if attention_mask is not None:
        mask = attention_mask[:, :, :, -key.shape[2]:]  # [B, 1, 1, L] broadcasts over heads
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    out = torch.matmul(torch.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype), value)
    return out.reshape(batch, heads, 1, dim).transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, grouped_decode_attention)
AttentionMaskInterface.register(NAME, sdpa_mask)
