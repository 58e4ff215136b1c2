"""Token ids and logprobs on the bus: Avro arrays (today's ModelCall) against packed little-endian bytes.

    .venv/bin/python bench/token_encoding.py [--tokens 1000 8000 30000] [--repeats 20]

For a record of N prompt token ids, and N/10 response ids with their
logprobs, both layouts side by side in one run with fastavro's schemaless
writer and reader: arrays of int and float (varints and 4-byte floats, one
item at a time in Python), or three `bytes` fields holding int32 and float32
little-endian (`array.array` in and out, a buffer copy). Prints encoded size,
encode and decode time (median of --repeats) and the ratio; writes
bench/results/token_encoding.png. It measures the layout alone, the rest of a
ModelCall (request JSON, timings) aside.
"""

from __future__ import annotations

import random
import shutil
import statistics
import time
from array import array
from collections.abc import Callable
from io import BytesIO
from typing import Any

from fastavro import parse_schema, schemaless_reader, schemaless_writer
from rich.console import Console
from rich.table import Table

from _shared import arguments, pyplot, save

console = Console(width=max(120, shutil.get_terminal_size().columns))

ARRAYS = parse_schema({"type": "record", "name": "Arrays", "fields": [
    {"name": "prompt_token_ids", "type": {"type": "array", "items": "int"}},
    {"name": "response_token_ids", "type": {"type": "array", "items": "int"}},
    {"name": "response_logprobs", "type": {"type": "array", "items": "float"}}]})
PACKED = parse_schema({"type": "record", "name": "Packed", "fields": [
    {"name": "prompt_token_ids", "type": "bytes"}, {"name": "response_token_ids", "type": "bytes"},
    {"name": "response_logprobs", "type": "bytes"}]})


def packed(prompt: list[int], response: list[int], logprobs: list[float]) -> dict[str, bytes]:
    return {"prompt_token_ids": array("i", prompt).tobytes(), "response_token_ids": array("i", response).tobytes(),
            "response_logprobs": array("f", logprobs).tobytes()}  # little-endian on every host we run on


def unpacked(record: dict[str, bytes]) -> tuple[list[int], list[int], list[float]]:
    ints, floats = array("i"), array("f")
    ints.frombytes(record["prompt_token_ids"])
    response = array("i")
    response.frombytes(record["response_token_ids"])
    floats.frombytes(record["response_logprobs"])
    return ints.tolist(), response.tolist(), floats.tolist()


def timed(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def measure(n: int, repeats: int) -> dict[str, float]:
    rng = random.Random(n)
    prompt = [rng.randrange(150_000) for _ in range(n)]  # a real vocabulary's ids: 2-3 byte varints
    response = [rng.randrange(150_000) for _ in range(max(1, n // 10))]
    logprobs = [-rng.random() * 5 for _ in response]
    as_arrays = {"prompt_token_ids": prompt, "response_token_ids": response, "response_logprobs": logprobs}

    def write(schema: Any, datum: Any) -> bytes:
        out = BytesIO()
        schemaless_writer(out, schema, datum)
        return out.getvalue()

    arrays_bytes = write(ARRAYS, as_arrays)
    packed_bytes = write(PACKED, packed(prompt, response, logprobs))
    back = unpacked(schemaless_reader(BytesIO(packed_bytes), PACKED, None))  # type: ignore[arg-type]
    assert back[0] == prompt and back[1] == response  # the same ids back; logprobs to float32's precision
    assert max(abs(a - b) for a, b in zip(back[2], logprobs, strict=True)) < 1e-6
    return {
        "arrays KB": len(arrays_bytes) / 1024, "packed KB": len(packed_bytes) / 1024,
        "arrays encode ms": timed(lambda: write(ARRAYS, as_arrays), repeats) * 1000,
        "packed encode ms": timed(lambda: write(PACKED, packed(prompt, response, logprobs)), repeats) * 1000,
        "arrays decode ms": timed(lambda: schemaless_reader(BytesIO(arrays_bytes), ARRAYS, None), repeats) * 1000,
        "packed decode ms": timed(lambda: unpacked(schemaless_reader(  # type: ignore[arg-type]
            BytesIO(packed_bytes), PACKED, None)), repeats) * 1000,
    }


def main() -> None:
    parser = arguments(__doc__, "token_encoding.png")
    parser.add_argument("--tokens", type=int, nargs="+", default=[1000, 8000, 30000])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    rows = {n: measure(n, args.repeats) for n in args.tokens}
    table = Table(title="Token ids and logprobs: Avro arrays against packed bytes (fastavro, one record)")
    for column in ("prompt tokens", "KB arrays / packed", "encode ms arrays / packed", "decode ms arrays / packed",
                   "decode speed-up"):
        table.add_column(column, justify="right")
    for n, r in rows.items():
        table.add_row(f"{n:,}", f"{r['arrays KB']:,.1f} / {r['packed KB']:,.1f}",
                      f"{r['arrays encode ms']:.2f} / {r['packed encode ms']:.2f}",
                      f"{r['arrays decode ms']:.2f} / {r['packed decode ms']:.2f}",
                      f"{r['arrays decode ms'] / r['packed decode ms']:.1f}x")
    console.print(table)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ns = list(rows)
    ax.plot(ns, [rows[n]["arrays decode ms"] for n in ns], "o-", label="Avro arrays")
    ax.plot(ns, [rows[n]["packed decode ms"] for n in ns], "o-", label="packed bytes")
    ax.set(title="decode time per record", xlabel="prompt tokens", ylabel="ms", xscale="log", yscale="log")
    ax.legend()
    save(fig, args.out, console)


if __name__ == "__main__":
    main()
