"""What the benchmarks share: a scratch folder with a broker of its own, engine and gateway processes, and a plot
saved next to the figures."""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console

from infra.kafka.launcher import KafkaBroker
from infra.kafka.settings import BrokerSettings
from infra.processes import free_port, wait_healthy
from schemas.admin import ensure_topics
from schemas.settings import BusSettings

RESULTS = Path(__file__).parent / "results"
SECRET, ADMIN = "bench-secret-key", "bench-admin-key"  # the gateways' the benchmarks start


def scratch_broker(prefix: str) -> tuple[Path, KafkaBroker]:
    """A new temporary folder and a (not yet started) broker on free ports keeping its state under it."""
    scratch = Path(tempfile.mkdtemp(prefix=prefix))
    return scratch, KafkaBroker(BrokerSettings(state_dir=scratch / "kafka", port=free_port(),
                                               controller_port=free_port()))


def pyplot() -> Any:
    """matplotlib's pyplot on the file-only backend (benchmarks run without a display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, out: Path, console: Console) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    console.print(f"plot: {out}")


def arguments(doc: str | None, plot: str) -> argparse.ArgumentParser:
    """A bench's command line: its docstring as help, and `--out` for its plot (under bench/results/)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=RESULTS / plot, help="where the plot goes")
    return parser


def start_engine(kind: str, model: Path, replies: tuple[str, ...], scratch: Path, env: dict[str, str] | None = None
                 ) -> tuple[str, subprocess.Popen[bytes]]:
    """FakeVLLM scripted with `replies` (kind fake), else the embedded engine on `model` (`env`: TETHER_ENGINE_*
    settings over this process's environment)."""
    port = free_port()
    if kind == "fake":
        args = [sys.executable, "-m", "tests.fakes.vllm", "--tokenizer", str(model), "--port", str(port)]
        for reply in replies:
            args += ["--reply", reply]
    else:
        args = [sys.executable, "-m", "tether.cli", "engine", "serve", "--model", str(model), "--port", str(port)]
    process = subprocess.Popen(args, stdout=(scratch / f"engine-{port}.log").open("wb"), stderr=subprocess.STDOUT,
                               env={**os.environ, **(env or {})})
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, process, "the engine")
    return url, process


def start_gateway(engine: str, model: Path, bus: BusSettings, run_id: str, scratch: Path,
                  env: dict[str, str] | None = None) -> tuple[str, subprocess.Popen[bytes]]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "tether.cli", "gateway", "serve", "--engine", engine, "--tokenizer", str(model),
         "--port", str(port), "--run-id", run_id],
        env={**os.environ, "TETHER_BUS_BOOTSTRAP_SERVERS": bus.bootstrap_servers, "TETHER_GATEWAY_SECRET": SECRET,
             "TETHER_GATEWAY_ADMIN_KEY": ADMIN, **(env or {})},
        stdout=(scratch / f"gateway-{port}.log").open("wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, process, "the gateway")
    return url, process


def start_processor(bus: BusSettings, scratch: Path, worker: int = 0, sink: bool = True) -> subprocess.Popen[bytes]:
    """`tether processors run`, the chdb sink on unless not `sink`; further workers of the same app share its
    partitions (the sink's chdb folder is each worker's own: chdb holds it)."""
    return subprocess.Popen(
        [sys.executable, "-m", "tether.cli", "processors", "run"],
        env={**os.environ, "TETHER_BUS_BOOTSTRAP_SERVERS": bus.bootstrap_servers,
             "TETHER_PROCESSOR_DATA_DIR": str(scratch / f"proc-{worker}"),
             "TETHER_PROCESSOR_CLICKHOUSE_DSN": f"chdb://{scratch / f'clickhouse-{worker}'}" if sink else ""},
        stdout=(scratch / f"processor-{worker}.log").open("wb"), stderr=subprocess.STDOUT)


@contextmanager
def kafka_and_processors(prefix: str, sink: bool = True) -> Iterator[tuple[Path, BusSettings, subprocess.Popen[bytes]]]:
    """A scratch folder, its own broker with the topics, and `tether processors run` (the chdb sink on unless not
    `sink`), for the length of a `with` block; all of it gone afterwards (kept with TETHER_BENCH_KEEP=1)."""
    scratch, broker = scratch_broker(prefix)
    processor: subprocess.Popen[bytes] | None = None
    try:
        broker.start()
        bus = BusSettings(bootstrap_servers=broker.bootstrap)
        asyncio.run(ensure_topics(bus))
        processor = start_processor(bus, scratch, sink=sink)
        yield scratch, bus, processor
    finally:
        if processor is not None:
            processor.terminate()
            processor.wait(60)
        broker.stop()
        if not os.environ.get("TETHER_BENCH_KEEP"):
            shutil.rmtree(scratch, ignore_errors=True)
