"""What the engine serves: a request as validated, the chunks it answers with, and the state of each choice while
it is generated (the engine thread's; the asyncio side reads only its submission's queue)."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

from transformers import DynamicCache

from engine.sampling import SamplingParams
from engine.text import TextStream


@dataclass(frozen=True, kw_only=True)
class Request:
    """One completion request, already validated against the protocol; n choices share the prompt."""

    prompt_ids: list[int]
    max_tokens: int
    n: int = 1
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    stream: bool = True  # a chunk per token; otherwise one chunk per choice when it finishes


@dataclass(kw_only=True)
class Chunk:
    """Tokens of one choice since its previous chunk, with their logprobs and the text they add."""

    index: int
    version: int
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    tops: list[list[tuple[int, float]]] = field(default_factory=list)
    text_offsets: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    stop_reason: str | int | None = None


@dataclass(eq=False, kw_only=True)
class Submission:
    request: Request
    queue: asyncio.Queue[Chunk | BaseException]
    loop: asyncio.AbstractEventLoop
    version: int = -1
    cancelled: bool = False

    def put(self, item: Chunk | BaseException) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


def deliver(batch: list[tuple[Submission, Chunk]]) -> None:
    for submission, chunk in batch:
        submission.queue.put_nowait(chunk)


@dataclass(eq=False, kw_only=True)
class Sequence:
    submission: Submission
    index: int
    text: TextStream
    rng: random.Random
    chunk: Chunk
    next_token: int = -1
    generated: int = 0
    cache: DynamicCache | None = None  # deterministic mode: the sequence's own keys and values
    length: int = 0  # positions in `cache`


def by_submission(seqs: list[Sequence]) -> dict[Submission, list[Sequence]]:
    """The n choices of each request together, in order."""
    out: dict[Submission, list[Sequence]] = {}
    for seq in seqs:
        out.setdefault(seq.submission, []).append(seq)
    return out
