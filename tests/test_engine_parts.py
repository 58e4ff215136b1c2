"""The engine's pure parts: sampling distribution, incremental text with stops, the batched KV cache."""

from __future__ import annotations

import asyncio
import math
import random
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, PreTrainedModel

from engine import attention
from engine.engine import Engine
from engine.forward import decode_logits, supports_direct
from engine.kv_batch import KVBatch, cache_tensors
from engine.protocol import CompletionRequest
from engine.sampling import SamplingParams, distribution, sample
from engine.sequences import Request
from engine.text import TextStream

logit_rows = st.lists(st.floats(-20, 20), min_size=2, max_size=40)


@given(logit_rows, st.floats(0.05, 3.0), st.floats(0.01, 1.0))
def test_distribution_is_normalised_and_keeps_the_smallest_nucleus(row: list[float], t: float, p: float) -> None:
    logits = torch.tensor([row])
    logp = distribution(logits, torch.tensor([t]), torch.tensor([p]))[0]
    assert math.isclose(float(logp.exp().sum()), 1.0, rel_tol=1e-4)
    full = torch.softmax(logits[0] / t, dim=-1)
    kept = torch.isfinite(logp)
    assert float(full[kept].sum()) >= p - 1e-4  # the nucleus holds at least top_p of the mass
    # ...and it is the smallest such set: every kept token is at least as likely as every dropped one.
    if not bool(kept.all()):
        assert float(full[kept].min()) >= float(full[~kept].max()) - 1e-6
        assert torch.allclose(logp[kept].exp(), full[kept] / full[kept].sum(), atol=1e-5)


@given(logit_rows, st.integers(0, 2**31 - 1))
def test_sampled_tokens_lie_in_the_nucleus_and_report_their_logprob(row: list[float], seed: int) -> None:
    logits = torch.tensor([row, row])
    params = [SamplingParams(temperature=0.8, top_p=0.5, seed=seed), SamplingParams(temperature=0.0)]
    out = sample(logits, params, [random.Random(seed), random.Random()])
    logp = distribution(logits, torch.tensor([0.8, 0.0]), torch.tensor([0.5, 1.0]))
    assert torch.isfinite(logp[0, out.tokens[0]])
    assert float(out.logprobs[0]) == pytest.approx(float(logp[0, out.tokens[0]]))
    model_logp = torch.log_softmax(torch.tensor(row), -1)
    assert float(model_logp[out.tokens[1]]) == float(model_logp.max())  # greedy: a most likely token
    assert float(out.logprobs[1]) == pytest.approx(float(model_logp.max()))


def test_seeded_rows_do_not_depend_on_their_batch() -> None:
    torch.manual_seed(0)
    row = torch.randn(1, 500)
    alone = sample(row, [SamplingParams(seed=5)], [random.Random(5)]).tokens[0]
    crowd = torch.cat([torch.randn(3, 500), row])
    params = [SamplingParams()] * 3 + [SamplingParams(seed=5)]
    shared = random.Random()
    batched = sample(crowd, params, [shared, shared, shared, random.Random(5)]).tokens[3]
    assert int(alone) == int(batched)


def test_sampling_follows_the_distribution() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]])).repeat(20000, 1)
    tokens = sample(logits, [SamplingParams()] * 20000, [random.Random(0)] * 20000).tokens
    freq = torch.bincount(tokens, minlength=3).float() / 20000
    assert torch.allclose(freq, torch.tensor([0.5, 0.3, 0.2]), atol=0.02)


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path) -> object:
    return AutoTokenizer.from_pretrained(tiny_model)


@given(st.text(max_size=60))
def test_text_stream_deltas_add_up_to_the_decoded_text(tokenizer: object, text: str) -> None:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]  # type: ignore[operator]
    stream, sent = TextStream(tokenizer, []), ""  # type: ignore[arg-type]
    for i in ids:
        stream.push(i)
        sent += stream.delta()
    stream.finish()
    sent += stream.delta(final=True)
    assert sent == stream.text == tokenizer.decode(ids, skip_special_tokens=True)  # type: ignore[attr-defined]
    assert "\ufffd" not in sent or "\ufffd" in text


def test_stop_strings_are_cut_and_never_streamed(tokenizer: object) -> None:
    ids = tokenizer("alpha beta STOP gamma", add_special_tokens=False)["input_ids"]  # type: ignore[operator]
    stream, sent = TextStream(tokenizer, ["STOP", "zzz"]), ""  # type: ignore[arg-type]
    for i in ids:
        stopped = stream.push(i)
        sent += stream.delta(final=stopped)
        assert "ST" not in sent or stopped
        if stopped:
            break
    assert stopped and stream.stop_reason == "STOP"
    assert sent == stream.text == "alpha beta "


@pytest.fixture(scope="module")
def model(tiny_model: Path) -> PreTrainedModel:
    loaded: PreTrainedModel = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    loaded.eval()
    return loaded


@pytest.mark.parametrize("direct", [False, True], ids=["model-forward", "direct-layers"])
def test_rows_joining_and_leaving_compute_what_they_would_alone(tiny_model: Path, model: PreTrainedModel,
                                                                 direct: bool) -> None:
    """Both decode paths of the engine give, for every row, the logits of a plain unbatched forward."""
    stepper: PreTrainedModel = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    if direct:
        assert supports_direct(stepper)
        stepper.set_attn_implementation(attention.NAME)
    prompts = [[5, 9, 200, 31, 7], [44], [8, 8, 8], [1000, 3, 2, 1, 9, 9, 12, 13]]
    batch, fed = KVBatch(), []
    with torch.no_grad():
        for i, prompt in enumerate(prompts):
            out = stepper(input_ids=torch.tensor([prompt]), past_key_values=DynamicCache(), use_cache=True)
            batch.add([(cache_tensors(out.past_key_values), len(prompt))])
            fed.append(list(prompt))
            if i == 2:
                batch.keep([0, 2])  # the second sequence leaves mid-flight
                fed.pop(1)
            cache, mask, positions = batch.step_inputs(torch.device("cpu"))
            step = torch.tensor([[17 + j] for j in range(len(fed))])
            logits = decode_logits(stepper, step, mask, positions, cache, direct)
            batch.advance(cache)
            for j, seq in enumerate(fed):
                seq.append(17 + j)
                alone = model(input_ids=torch.tensor([seq])).logits[0, -1]
                assert torch.allclose(logits[j], alone, atol=1e-5)


async def test_in_process_weight_updates_are_seen_under_the_new_version(tiny_model: Path) -> None:
    """The collocated trainer shares the model object: it changes tensors in place while the engine is drained."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    engine = Engine(model, AutoTokenizer.from_pretrained(tiny_model), version=3)
    engine.start()
    try:
        request = Request(prompt_ids=[4, 5, 6], max_tokens=8, sampling=SamplingParams(temperature=0),
                          ignore_eos=True)

        async def greedy() -> tuple[list[int], set[int]]:
            chunks = [c async for c in engine.generate(request)]
            return [t for c in chunks for t in c.token_ids], {c.version for c in chunks}

        before, v = await greedy()
        assert v == {3}
        held = asyncio.create_task(greedy())
        async with engine.exclusive(new_version=4) as shared:
            assert shared is model and engine.paused
            await asyncio.sleep(0.2)
            assert not held.done()  # queued, not rejected, while weights change
            with torch.no_grad():
                model.model.norm.weight.mul_(-1.0)
        after, v = await held
        assert v == {4} and after != before
    finally:
        engine.stop()


@given(st.integers(1, 64), st.integers(1, 256), st.none() | st.integers(1, 512), st.none() | st.integers(1, 512))
def test_a_request_without_max_tokens_gets_the_default_within_the_context(
        prompt: int, room: int, default: int | None, asked: int | None) -> None:
    body = CompletionRequest(model="m", prompt=[1] * prompt, max_tokens=asked)
    limit = body.to_engine([1] * prompt, 20, room, default).max_tokens
    if asked is not None:
        assert limit == asked  # what the caller asked for stands (the engine refuses it if it does not fit)
        return
    assert limit >= 1 and (default is None or limit <= default)
    if prompt < room:
        assert prompt + limit <= room  # never past the context
        if default is None or default >= room - prompt:
            assert limit == room - prompt  # the rest of the context, as vLLM gives
