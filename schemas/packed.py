"""Lists of numbers as packed little-endian bytes: how token ids, masks and logprobs travel since v5.

An Avro array is written and read one item at a time in Python (a varint or a
float each); the same list as `bytes` is one buffer copy each way, 10-12x
faster to decode (bench/token_encoding.py). A schema marks such a field with
`"packed": {"of": <the event's field>, "as": <kind>}`; `schemas.mapper` packs
and unpacks it.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence
from typing import Any

#: kind → array typecode; "bool" is one byte per item, 0 or 1
TYPECODES = {"int32": "i", "int64": "q", "float32": "f", "bool": "B"}
_SWAP = sys.byteorder == "big"

assert array("i").itemsize == 4 and array("q").itemsize == 8 and array("f").itemsize == 4


def pack(kind: str, values: Sequence[Any]) -> bytes:
    """OverflowError for a number the kind cannot hold, as fastavro would give for an Avro int."""
    packed = array(TYPECODES[kind], values)
    if _SWAP:
        packed.byteswap()
    return packed.tobytes()


def unpack(kind: str, data: bytes) -> list[Any]:
    if kind == "bool":
        return list(map(bool, data))
    values = array(TYPECODES[kind])
    values.frombytes(data)  # ValueError when the length is not a whole number of items
    if _SWAP:
        values.byteswap()
    return values.tolist()
