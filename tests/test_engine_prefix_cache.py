"""Prompts that extend recent ones: the reused cache gives what a full prefill gives, and never outlives weights."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM, AutoTokenizer

from engine.engine import Engine
from engine.kv_batch import KV
from engine.prefix_cache import MIN_REUSE, PrefixCache, shared_prefix
from engine.sampling import SamplingParams
from engine.sequences import Request


@given(st.lists(st.integers(0, 3), max_size=40), st.lists(st.integers(0, 3), max_size=40))
def test_shared_prefix_is_the_longest_common_start(a: list[int], b: list[int]) -> None:
    n = shared_prefix(torch.tensor(a, dtype=torch.long), torch.tensor(b, dtype=torch.long))
    assert a[:n] == b[:n]
    assert n == min(len(a), len(b)) or a[n] != b[n]


def fake_kv(length: int, value: float = 0.0) -> KV:
    return [(torch.full((1, 2, length, 4), value), torch.full((1, 2, length, 4), value)) for _ in range(2)]


def test_the_longest_prefix_is_reused_cut_to_its_length_and_never_the_last_id() -> None:
    cache = PrefixCache(1 << 20)
    base = list(range(100, 200))
    cache.put(base[:60], fake_kv(60, 1.0))
    cache.put([7] * 80, fake_kv(80, 2.0))
    n, kv = cache.longest([*base, 5])
    assert n == 60 and kv[0][0].shape[2] == 60 and float(kv[0][0][0, 0, 0, 0]) == 1.0
    n, _ = cache.longest(base[:60])  # the whole entry: the last id is recomputed for its logits
    assert n == 59
    assert cache.longest(base[:MIN_REUSE - 1] + [0] * 50) == (0, [])  # too short a match to pay
    assert cache.longest([1, 2, 3] * 30) == (0, [])
    assert (cache.hits, cache.reused_tokens) == (2, 119)


def test_an_extended_prompt_replaces_its_prefix_and_bytes_bound_the_cache() -> None:
    per_token = sum(k.nbytes + v.nbytes for k, v in fake_kv(1))
    cache = PrefixCache(per_token * 150)
    cache.put(list(range(50)), fake_kv(50))
    cache.put(list(range(70)), fake_kv(70))  # extends the first: it goes
    assert len(cache) == 1 and cache.bytes == per_token * 70
    cache.put([9] * 60, fake_kv(60))
    assert len(cache) == 2
    cache.longest([*range(70), 1])  # used: the other one is now the least recently used
    cache.put([8] * 40, fake_kv(40))
    assert len(cache) == 2 and cache.longest([9] * 61) == (0, []) and cache.longest(list(range(71)))[0] == 70
    cache.put([5] * 200, fake_kv(200))  # larger than the whole budget: not kept, nothing evicted for it
    assert len(cache) == 2 and cache.bytes <= cache.max_bytes


def engine_on(model_dir: Path, prefix_bytes: int) -> Engine:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return Engine(model, AutoTokenizer.from_pretrained(model_dir), prefix_cache_bytes=prefix_bytes)


async def answers(engine: Engine, prompts: list[list[int]], n: int = 1) -> list[tuple[list[int], list[float]]]:
    out = []
    for ids in prompts:
        request = Request(prompt_ids=ids, max_tokens=12, n=n, ignore_eos=True,
                          sampling=SamplingParams(temperature=0))
        chunks = [c async for c in engine.generate(request)]
        for i in range(n):
            mine = [c for c in chunks if c.index == i]
            out.append(([t for c in mine for t in c.token_ids], [lp for c in mine for lp in c.logprobs]))
    return out


async def test_an_agent_s_growing_prompts_get_what_a_full_prefill_gives(tiny_model: Path) -> None:
    rng = random.Random(0)
    system = [rng.randrange(10, 1000) for _ in range(300)]
    turn1 = system + [rng.randrange(10, 1000) for _ in range(40)]
    turn2 = turn1 + [rng.randrange(10, 1000) for _ in range(25)]  # the same conversation, one exchange longer
    other = system + [rng.randrange(10, 1000) for _ in range(30)]  # another rollout: the same system prompt
    prompts = [turn1, turn2, other, turn2]  # the last one exactly as before
    cached, plain = engine_on(tiny_model, 64 << 20), engine_on(tiny_model, 0)
    for engine in (cached, plain):
        engine.start()
    try:
        got, want = await answers(cached, prompts, n=2), await answers(plain, prompts, n=2)
    finally:
        for engine in (cached, plain):
            engine.stop()
    assert cached.prefixes.hits == 3 and cached.prefixes.reused_tokens == len(turn1) + len(system) + len(turn2) - 1
    assert plain.prefixes.hits == 0 and len(plain.prefixes) == 0
    for (tokens, logprobs), (tokens_plain, logprobs_plain) in zip(got, want, strict=True):
        assert tokens == tokens_plain
        assert logprobs == pytest.approx(logprobs_plain, abs=1e-4)


async def test_a_weight_change_empties_the_cache(tiny_model: Path) -> None:
    engine = engine_on(tiny_model, 64 << 20)
    engine.start()
    try:
        prompt = list(range(10, 210))
        (before,) = await answers(engine, [prompt])
        assert len(engine.prefixes) == 1
        async with engine.exclusive(new_version=1) as model:
            with torch.no_grad():
                model.model.norm.weight.mul_(-1.0)
        assert len(engine.prefixes) == 0
        (after,) = await answers(engine, [[*prompt, 5, 6]])
        assert engine.prefixes.hits == 0
    finally:
        engine.stop()
    fresh = engine_on(tiny_model, 0)
    with torch.no_grad():
        fresh.model.model.norm.weight.mul_(-1.0)
    fresh.start()
    try:
        (want,) = await answers(fresh, [[*prompt, 5, 6]])
    finally:
        fresh.stop()
    assert after[0] == want[0] and after != before
