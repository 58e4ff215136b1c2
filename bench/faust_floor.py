"""What Faust itself costs per record: the ceiling under the processors' join rate on this machine.

    .venv/bin/python bench/faust_floor.py [--records 60000] [--bytes 400]

A topic of --records records of --bytes random bytes (8 partitions, like
tether.calls) is filled first; then a Faust worker whose only agent counts
them in batches (`take_events`, as the join takes its events) reads them all,
twice over in fresh consumer groups. Prints records/s and CPU microseconds
per record of each pass. The join does that, and decodes, joins and
publishes on top; `bench/episode_scaling.py` gives its rate.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import time
import uuid

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from _shared import scratch_broker

TOPIC = "faust-floor"


def worker(bootstrap: str, records: int, data_dir: str) -> None:
    """The counting worker (run as `faust_floor.py --worker`): prints one line when it has seen them all."""
    import faust

    app = faust.App(f"faust-floor-{uuid.uuid4().hex[:8]}", broker=f"kafka://{bootstrap}", store="memory://",
                    key_serializer="raw", value_serializer="raw", web_enabled=False, datadir=data_dir,
                    consumer_auto_offset_reset="earliest", topic_partitions=8, stream_buffer_maxsize=2048)
    source = app.topic(TOPIC, key_type=bytes, value_type=bytes)
    first: tuple[float, float] | None = None
    seen = 0

    @app.agent(source)
    async def count(stream: faust.StreamT[bytes]) -> None:
        nonlocal first, seen
        async for batch in stream.take_events(500, within=0.02):  # type: ignore[attr-defined]
            first = first or (time.perf_counter(), time.process_time())
            seen += len(batch)
            if seen >= records:
                wall, cpu = time.perf_counter() - first[0], time.process_time() - first[1]
                print(f"FLOOR {seen} {wall:.4f} {cpu:.4f}", flush=True)
                os._exit(0)

    sys.argv = [sys.argv[0], "worker", "-l", "warn"]
    app.main()


async def fill(bootstrap: str, records: int, size: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(TOPIC, 8, 1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, max_batch_size=1 << 20)
    await producer.start()
    try:
        sent = [await producer.send(TOPIC, os.urandom(size), key=str(i % 997).encode()) for i in range(records)]
        await asyncio.gather(*sent)
    finally:
        await producer.stop()


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        worker(sys.argv[2], int(sys.argv[3]), sys.argv[4])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=60000)
    parser.add_argument("--bytes", type=int, default=400)
    args = parser.parse_args()
    scratch, broker = scratch_broker("tether-faust-floor-")
    broker.start()
    try:
        asyncio.run(fill(broker.bootstrap, args.records, args.bytes))
        for n in (1, 2):
            out = subprocess.run([sys.executable, __file__, "--worker", broker.bootstrap, str(args.records),
                                  str(scratch / f"faust-{n}")], capture_output=True, text=True, timeout=600)
            found = re.search(r"FLOOR (\d+) ([\d.]+) ([\d.]+)", out.stdout + out.stderr)  # Faust logs stdout
            if found is None:
                raise SystemExit(f"the counting worker said nothing:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
            seen, wall, cpu = found.groups()
            print(f"pass {n}: {int(seen):,} records, {int(seen) / float(wall):,.0f} records/s, "
                  f"{float(cpu) / int(seen) * 1e6:.1f} us CPU per record (a no-op agent, take_events of 500)")
    finally:
        broker.stop()


if __name__ == "__main__":
    main()
