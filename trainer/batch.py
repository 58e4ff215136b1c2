"""Task groups → a verl `DataProto` of packed rows: every segment once, no needless padding.

Position i of a segment predicts token i+1, so the trainable targets are the
tokens whose loss mask is set, each with its behaviour logprob, the weight
version that sampled it, its advantage (its rollout's, or with credit per call
that of the call whose response it is) and its rollout's normalisation weight.
Segments are packed first-fit-decreasing into rows (see `build_batch`);
within a row, `segment_ids` keep attention inside each segment
(a block-diagonal causal mask) and positions restart per segment.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from verl import DataProto

from schemas.events import Segment
from trainer.advantages import ScoredGroups
from trainer.algorithms import LossMode, per_task_weights

FIELDS = ("input_ids", "position_ids", "segment_ids", "targets", "loss_mask", "behaviour_log_probs", "versions",
          "advantages", "token_weights")


@dataclass(frozen=True, kw_only=True)
class Piece:
    """One segment as rows take it: position i predicts target i."""
    tokens: list[int]
    targets: list[int]
    mask: list[float]
    behaviour: list[float]
    versions: list[int]
    advantages: list[float]  # per target: the rollout's, or (credit per call) that of the call it came from
    weight: float


def _token_advantages(s: Segment, calls: dict[int, float], rollout: float) -> list[float]:
    out = [rollout] * len(s.token_ids)
    for span in s.spans:
        if span.seq in calls:
            out[span.start:span.end] = [calls[span.seq]] * (span.end - span.start)
    return out


def pieces(scored: ScoredGroups, mode: LossMode) -> list[Piece]:
    """Every segment of the groups with two tokens or more, its targets' advantages and its rollout's weight."""
    groups = scored.groups
    tokens = [[sum(sum(s.loss_mask[1:]) for s in r.segments) for r in g.rollouts] for g in groups]
    weights = per_task_weights(tokens) if mode == "per-task" else [[1.0] * len(t) for t in tokens]
    out = []
    for g, group in enumerate(groups):
        for r, rollout in enumerate(group.rollouts):
            given = scored.given[g][r]
            for s in rollout.segments:
                if len(s.token_ids) < 2:
                    continue
                out.append(Piece(tokens=s.token_ids[:-1], targets=s.token_ids[1:],
                                 mask=[float(m) for m in s.loss_mask[1:]], behaviour=s.logprobs[1:],
                                 versions=s.weight_versions[1:],
                                 advantages=_token_advantages(s, given.calls, given.rollout)[1:],
                                 weight=weights[g][r]))
    return out


def build_batch(scored: ScoredGroups, row_tokens: int | None = None, pack: bool = True,
                mode: LossMode = "per-task") -> DataProto:
    """Rows hold at most max(row_tokens, the longest segment) tokens: packing never makes the attention of a
    row costlier than the longest segment's own. `pack=False` (and seq-mean-token-mean, where a row must be
    one sequence): one segment per row. Rows come longest first, so micro-batches of neighbours pad little."""
    laid = sorted(pieces(scored, mode), key=lambda p: -len(p.tokens))
    capacity = max(row_tokens or 0, len(laid[0].tokens) if laid else 0)
    rows: list[list[Piece]] = []
    room: list[int] = []
    for piece in laid:
        n = len(piece.tokens)
        spot = next((i for i, free in enumerate(room) if free >= n), None) if pack and mode != \
            "seq-mean-token-mean" else None
        if spot is None:
            rows.append([piece])
            room.append(capacity - n)
        else:
            rows[spot].append(piece)
            room[spot] -= n
    length = max((sum(len(p.tokens) for p in row) for row in rows), default=0)
    data = {name: torch.zeros(len(rows), length, dtype=torch.float32 if name in (
        "loss_mask", "behaviour_log_probs", "advantages", "token_weights") else torch.long) for name in FIELDS}
    data["segment_ids"].fill_(-1)
    for i, row in enumerate(rows):
        at = 0
        for j, p in enumerate(row):
            span = slice(at, at + len(p.tokens))
            data["input_ids"][i, span] = torch.tensor(p.tokens)
            data["position_ids"][i, span] = torch.arange(len(p.tokens))
            data["segment_ids"][i, span] = j
            data["targets"][i, span] = torch.tensor(p.targets)
            data["loss_mask"][i, span] = torch.tensor(p.mask)
            data["behaviour_log_probs"][i, span] = torch.tensor(p.behaviour)
            data["versions"][i, span] = torch.tensor(p.versions)
            data["advantages"][i, span] = torch.tensor(p.advantages)
            data["token_weights"][i, span] = p.weight
            at += len(p.tokens)
    batch: DataProto = DataProto.from_dict(tensors=data, meta_info={"task_groups": len(scored.groups),
                                                                    "segments": len(laid)})
    return batch


def attention_mask(segment_ids: torch.Tensor) -> torch.Tensor:
    """(rows, 1, L, L) bool: causal, and only within a segment (padding, -1, sees nothing but itself)."""
    length = segment_ids.shape[-1]
    causal = torch.tril(torch.ones(length, length, dtype=torch.bool, device=segment_ids.device))
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    eye = torch.eye(length, dtype=torch.bool, device=segment_ids.device)
    return ((causal & same) | eye)[:, None]
