"""What a rollout's sandbox adds to its start and end: the same command spawned directly and in the sandbox.

    .venv/bin/python bench/sandbox_start.py [--runs 20] [--files 300] [--file-kb 8]

Side by side in one run, each `--runs` times, one after another:
(a) `true` spawned directly; (b) `true` in the sandbox (`python -m
infra.sandbox`) with an empty working copy: the launcher's interpreter, both
bubblewraps, the relay, the first process inside; (c) the same with a working
copy of `--files` files of `--file-kb` each (about a small package's checkout),
copied into the sandbox's tmpfs and back; (d) a Python interpreter started
directly and (e) in the sandbox, the start every Python harness pays. Prints
the median and 90th percentile wall time of each, and the sandbox's added
median, in milliseconds. Writes bench/results/sandbox_start.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from infra.sandbox.policy import Policy

RESULTS = Path(__file__).parent / "results" / "sandbox_start.json"


def timed(argv: list[str], cwd: Path) -> float:
    began = time.perf_counter()
    subprocess.run(argv, cwd=cwd, check=True, stdout=subprocess.DEVNULL, env={"PATH": os.environ["PATH"]})
    return (time.perf_counter() - began) * 1000


def sandboxed(workdir: Path, command: list[str]) -> list[str]:
    policy = Policy(workdir=str(workdir), gateway="http://127.0.0.1:19")
    return [sys.executable, "-m", "infra.sandbox", policy.model_dump_json(), "--", *command]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--files", type=int, default=300)
    parser.add_argument("--file-kb", type=int, default=8)
    args = parser.parse_args()
    console = Console()
    with tempfile.TemporaryDirectory(prefix="tether-bench-sandbox-") as scratch:
        empty, checkout = Path(scratch) / "empty", Path(scratch) / "checkout"
        empty.mkdir()
        for i in range(args.files):
            folder = checkout / f"pkg{i % 20}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"m{i}.py").write_bytes(os.urandom(args.file_kb * 1024))
        python = [sys.executable, "-I", "-c", "pass"]
        cases = {"true, direct": (["true"], empty, False), "true, sandbox": (["true"], empty, True),
                 f"true, sandbox, {args.files} files": (["true"], checkout, True),
                 "python, direct": (python, empty, False), "python, sandbox": (python, empty, True)}
        times: dict[str, list[float]] = {name: [] for name in cases}
        with Progress(console=console, transient=True) as progress:
            bar = progress.add_task("runs", total=args.runs * len(cases))
            for _ in range(args.runs):
                for name, (command, workdir, inside) in cases.items():
                    times[name].append(timed(sandboxed(workdir, command) if inside else command, workdir))
                    progress.advance(bar)
    table = Table(title=f"sandbox start and end, {args.runs} runs each (ms)")
    for column in ("case", "median", "p90", "added (median)"):
        table.add_column(column, justify="right" if column != "case" else "left")
    summary = {}
    for name, found in times.items():
        median = statistics.median(found)
        p90 = statistics.quantiles(found, n=10)[-1] if len(found) > 1 else found[0]
        base = statistics.median(times["python, direct" if name.startswith("python") else "true, direct"])
        added = median - base if "sandbox" in name else 0.0
        summary[name] = {"median_ms": round(median, 1), "p90_ms": round(p90, 1), "added_ms": round(added, 1)}
        table.add_row(name, f"{median:.1f}", f"{p90:.1f}", f"{added:.1f}" if "sandbox" in name else "")
    console.print(table)
    console.print(f"as root: {os.geteuid() == 0}; bubblewrap: {shutil.which('bwrap')}")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({"runs": args.runs, "files": args.files, "file_kb": args.file_kb,
                                   "cases": summary}, indent=2) + "\n")


if __name__ == "__main__":
    main()
