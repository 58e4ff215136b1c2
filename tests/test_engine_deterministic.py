"""The engine's deterministic mode: a request's tokens and logprobs are the same bytes whatever else is served.

The same 32 prompts (sampled at temperature 1 with their own seeds, so every
token depends on the exact logits) go alone, then 1, 8 and 32 at a time, on an
engine with its prefix cache off and on one whose cache already holds their
shared prefixes. Every run must give byte-equal tokens, logprobs and top
logprobs.
"""

from __future__ import annotations

import asyncio
import random
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from engine.alone import CHUNK
from engine.engine import Engine
from engine.sampling import SamplingParams
from engine.sequences import Request

Result = tuple[tuple[int, ...], bytes, tuple[tuple[int, bytes], ...]]

SHARED = [random.Random(1).randrange(3, 1000) for _ in range(CHUNK * 2 + 40)]  # a harness's system prompt


def _prompts() -> list[list[int]]:
    """Half open with one long prefix (longer than two chunks, so a cache hit spans a chunk boundary and stops
    inside one), with tails of different lengths; the other half stand alone."""
    rng = random.Random(7)
    prompts = []
    for i in range(32):
        tail = [rng.randrange(3, 1000) for _ in range(rng.randrange(5, 300))]
        prompts.append(SHARED[: CHUNK + 17 * i] + tail if i % 2 == 0 else tail + [7] * (i % 5))
    return prompts


def _request(i: int, prompt: list[int]) -> Request:
    return Request(prompt_ids=prompt, max_tokens=10, n=1 + (i % 7 == 0), ignore_eos=True,
                   sampling=SamplingParams(temperature=1.0, seed=1000 + i, top_logprobs=2))


def _bits(values: list[float]) -> bytes:
    return struct.pack(f"<{len(values)}d", *values)


async def _one(engine: Engine, i: int, prompt: list[int]) -> list[Result]:
    per_choice: dict[int, tuple[list[int], list[float], list[tuple[int, bytes]]]] = {}
    async for chunk in engine.generate(_request(i, prompt)):
        tokens, logprobs, tops = per_choice.setdefault(chunk.index, ([], [], []))
        tokens += chunk.token_ids
        logprobs += chunk.logprobs
        tops += [(t, _bits([lp])) for top in chunk.tops for t, lp in top]
    return [(tuple(t), _bits(lp), tuple(top)) for _, (t, lp, top) in sorted(per_choice.items())]


async def _serve(engine: Engine, prompts: list[list[int]], concurrency: int) -> list[list[Result]]:
    results: list[list[Result]] = []
    for start in range(0, len(prompts), concurrency):
        results += await asyncio.gather(*(_one(engine, i, p) for i, p in enumerate(prompts)
                                          if start <= i < start + concurrency))
    return results


@contextmanager
def _engine(model_dir: Path, deterministic: bool, cache_mb: int) -> Iterator[Engine]:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    engine = Engine(model, AutoTokenizer.from_pretrained(model_dir), prefix_cache_bytes=cache_mb << 20,
                    deterministic=deterministic, max_batch=32)
    engine.start()
    try:
        yield engine
    finally:
        engine.stop()


@pytest.mark.parametrize("concurrency", [1, 8, 32])
async def test_the_same_request_gives_the_same_bytes_alone_under_load_and_from_cached_prefixes(
        tiny_model: Path, concurrency: int) -> None:
    prompts = _prompts()
    with _engine(tiny_model, deterministic=True, cache_mb=0) as engine:
        alone = [await _one(engine, i, p) for i, p in enumerate(prompts)]  # one request in the engine at a time
        assert await _serve(engine, prompts, concurrency) == alone
    with _engine(tiny_model, deterministic=True, cache_mb=256) as engine:
        await _serve(engine, [SHARED[: CHUNK + 40], SHARED], 2)  # caches holding the prompts' opening ids
        hits = engine.prefixes.hits
        assert await _serve(engine, prompts, concurrency) == alone
        assert engine.prefixes.hits - hits >= 16  # the shared half started from cached keys and values


async def test_prompts_longer_than_a_chunk_agree_with_one_whole_forward(tiny_model: Path) -> None:
    """Chunking moves the last bits (other kernel shapes), never the result: a chunked prefill's first token
    distribution is the whole prompt's to float tolerance, so the mode serves the same model."""
    prompt = [*SHARED, 5, 6, 7]
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    with torch.no_grad():
        whole = torch.log_softmax(model(input_ids=torch.tensor([prompt])).logits[0, -1], dim=-1)
    with _engine(tiny_model, deterministic=True, cache_mb=0) as engine:
        request = Request(prompt_ids=prompt, max_tokens=1, ignore_eos=True,
                          sampling=SamplingParams(temperature=0, top_logprobs=5))
        chunks = [c async for c in engine.generate(request)]
    top = chunks[0].tops[0]
    assert [t for t, _ in top] == whole.topk(5).indices.tolist()
    assert torch.allclose(torch.tensor([lp for _, lp in top]), whole.topk(5).values, atol=1e-5)


async def test_the_normal_mode_moves_with_the_batch_which_is_what_the_mode_is_for(tiny_model: Path) -> None:
    """Without the mode the same requests come out otherwise under concurrency (batched kernels, left padding):
    the comparison above can tell the two apart."""
    prompts = _prompts()[:8]
    with _engine(tiny_model, deterministic=False, cache_mb=0) as engine:
        alone = [await _one(engine, i, p) for i, p in enumerate(prompts)]
        assert await _serve(engine, prompts, 8) != alone
