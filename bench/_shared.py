"""What the benchmarks share: a scratch folder with a broker of its own, and a plot saved next to the figures."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console

from infra.kafka.launcher import KafkaBroker
from infra.kafka.settings import BrokerSettings
from infra.processes import free_port

RESULTS = Path(__file__).parent / "results"


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
