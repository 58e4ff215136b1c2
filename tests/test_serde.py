"""Events survive encoding exactly; bad bytes fail with the right error, never silently."""

from __future__ import annotations

import json
import struct
from dataclasses import replace
from io import BytesIO
from typing import Any

import pytest
from fastavro import schemaless_reader, schemaless_writer
from hypothesis import given
from hypothesis import strategies as st

from schemas import events as ev
from schemas.errors import CorruptRecord, EncodeError, InvalidEvent, NotSingleObject, UnknownSchema
from schemas.mapper import to_avro
from schemas.registry import EVENT_TYPES, default_registry
from schemas.serde import HEADER_SIZE, MAGIC, decode, encode
from tests.factories import STRATEGIES, example, examples, model_calls, near_megabyte


def crc64_avro(data: bytes) -> int:
    """The Avro spec's reference fingerprint, written out to check the library we use against it."""
    empty = 0xC15D213AA4D7A795
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (empty & -(fp & 1))
        table.append(fp)
    fp = empty
    for byte in data:
        fp = (fp >> 8) ^ table[(fp ^ byte) & 0xFF]
    return fp


def test_every_event_type_has_a_strategy_and_an_example() -> None:
    assert set(STRATEGIES) == set(EVENT_TYPES)
    assert {type(e) for e in examples()} == set(EVENT_TYPES)


@pytest.mark.parametrize("cls", EVENT_TYPES, ids=lambda c: c.__name__)
def test_every_event_round_trips(cls: type) -> None:
    @given(STRATEGIES[cls])
    def round_trip(event: ev.Event) -> None:
        assert decode(encode(event)) == event

    round_trip()


@given(model_calls(big=True))
def test_model_call_near_one_megabyte_round_trips(event: ev.ModelCall) -> None:
    data = encode(event)
    assert len(data) > 900_000
    assert decode(data) == event


@given(near_megabyte, st.lists(st.integers(0, 2**31 - 1), min_size=0, max_size=2000))
def test_dead_letter_keeps_large_payloads_whole(text: str, tokens: list[int]) -> None:
    payload = text.encode() + struct.pack(f"<{len(tokens)}i", *tokens)
    letter = replace(example(ev.DeadLetter), value=payload)
    assert decode(encode(letter)) == letter


@pytest.mark.parametrize("cls", EVENT_TYPES, ids=lambda c: c.__name__)
def test_header_is_single_object_encoding_with_spec_fingerprint(cls: type) -> None:
    (event,) = [e for e in examples() if type(e) is cls]
    data = encode(event)
    assert data[:2] == MAGIC
    canonical = default_registry().current(cls).source.read_text()
    from fastavro.schema import to_parsing_canonical_form

    expected = crc64_avro(to_parsing_canonical_form(json.loads(canonical)).encode())
    assert data[2:HEADER_SIZE] == expected.to_bytes(8, "little")


def test_empty_and_unicode_values_round_trip() -> None:
    call = example(ev.ModelCall)
    empty = replace(call, prompt_token_ids=[], response_token_ids=[], response_logprobs=[], request_json="",
                    response_json="\u2603 \U0001f916 ∑ 日本語 \x00")
    assert decode(encode(empty)) == empty


def test_garbage_is_not_single_object() -> None:
    with pytest.raises(NotSingleObject):
        decode(b"hello, world")
    with pytest.raises(NotSingleObject):
        decode(b"")


def test_unknown_fingerprint_is_reported() -> None:
    with pytest.raises(UnknownSchema, match="fingerprint"):
        decode(MAGIC + b"\x01" * 8 + b"\x00")


def test_truncated_and_padded_bodies_are_corrupt() -> None:
    data = encode(example(ev.ModelCall))
    with pytest.raises(CorruptRecord):
        decode(data[:-5])
    with pytest.raises(CorruptRecord, match="trailing"):
        decode(data + b"\x00")


def test_bytes_that_decode_to_an_invalid_event_are_corrupt() -> None:
    schema = default_registry().current(ev.RolloutSealed)
    body = BytesIO()
    datum = {**to_avro(example(ev.RolloutSealed), schema.parsed), "call_ids": ["c", "c"]}
    schemaless_writer(body, schema.parsed, datum)
    with pytest.raises(CorruptRecord, match="distinct"):
        decode(MAGIC + schema.fingerprint + body.getvalue())


def test_invalid_events_cannot_be_built() -> None:
    call = example(ev.ModelCall)
    with pytest.raises(InvalidEvent, match="logprobs"):
        replace(call, response_logprobs=[])
    with pytest.raises(InvalidEvent, match="seq"):
        replace(call, seq=-1)
    with pytest.raises(InvalidEvent, match="rollout_id"):
        replace(call, rollout_id="")
    with pytest.raises(InvalidEvent, match="status"):
        ev.RolloutFinished(rollout_id="r", run_id="x", status="exploded", duration_s=1.0)


def test_values_outside_the_schema_fail_to_encode() -> None:
    with pytest.raises(EncodeError, match="ModelCall"):
        encode(replace(example(ev.ModelCall), seq=2**40))
    with pytest.raises(EncodeError, match="not an event"):
        encode(ev.Usage(prompt_tokens=1, completion_tokens=1))  # type: ignore[arg-type]


def test_token_ids_and_logprobs_travel_packed_and_the_arrays_of_older_writers_are_left_empty() -> None:
    call = replace(example(ev.ModelCall), prompt_token_ids=list(range(150_000, 151_000)))
    schema = default_registry().current(ev.ModelCall)
    datum: Any = schemaless_reader(BytesIO(encode(call)[HEADER_SIZE:]), schema.hinted, schema.hinted)
    assert datum["prompt_token_ids"] == datum["response_token_ids"] == datum["response_logprobs"] == []
    assert datum["prompt_token_ids_packed"] == struct.pack("<1000i", *call.prompt_token_ids)
    assert datum["response_logprobs_packed"] == struct.pack("<2f", *call.response_logprobs)
    group = example(ev.TaskGroup)
    (segment,) = group.rollouts[0].segments
    hinted = default_registry().current(ev.TaskGroup).hinted
    datum = schemaless_reader(BytesIO(encode(group)[HEADER_SIZE:]), hinted, hinted)
    packed = datum["rollouts"][0]["segments"][0]
    assert packed["token_ids"] == [] and packed["loss_mask_packed"] == bytes(segment.loss_mask)
    assert packed["weight_versions_packed"] == struct.pack("<3q", *segment.weight_versions)


def test_a_token_id_past_int32_is_refused_as_avro_refuses_an_int() -> None:
    with pytest.raises(EncodeError, match="ModelCall"):
        encode(replace(example(ev.ModelCall), prompt_token_ids=[2**31]))
