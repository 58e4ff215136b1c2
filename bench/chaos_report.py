"""The chaos bench's figures: the calls as the harnesses saw them, per fault and over time.

Each harness writes a line per call (bench/chaos_harness.py); these read them back and turn them, with the
faults' times and the monitor's versions, into the fault table (calls/s, p99 latency and failures before,
during and after each fault) and the plot. What the run is checked against lives in bench/chaos_checks.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from chaos_run import Run
from rich.console import Console
from rich.table import Table

from schemas.events import ModelCall

from _shared import pyplot, save


def read_calls(calls_dir: Path) -> list[dict[str, Any]]:
    calls = []
    for path in sorted(calls_dir.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                calls.append({**json.loads(line), "rollout": path.stem})
    return calls


def window(calls: list[dict[str, Any]], lo: float, hi: float) -> tuple[float, float | None, int]:
    """(ok calls/s, p99 latency of the ok calls in ms, calls failed) for calls ending in [lo, hi)."""
    inside = [c for c in calls if lo <= c["end"] < hi]
    ok = sorted(c["end"] - c["start"] for c in inside if c["status"] == "ok")
    p99 = ok[min(len(ok) - 1, int(0.99 * len(ok)))] * 1000 if ok else None
    return len(ok) / max(hi - lo, 1e-9), p99, sum(c["status"] != "ok" for c in inside)


def fault_table(run: Run, calls: list[dict[str, Any]]) -> Table:
    a = run.args
    span = min(a.settle, 20.0)
    table = Table(title=f"Faults under load: {a.concurrency} harnesses at once, a call every {a.interval} s, "
                        f"{a.turns} turns; SIGKILL, {a.down:.0f} s down, restart, {a.settle:.0f} s settle")
    for column in ("fault", "killed at", "back after", "recovered after", "first ok call after", "calls/s before",
                   "during", "after", "p99 ms before", "during", "after", "failed calls", "version"):
        table.add_column(column, justify="right")
    for f in run.faults:
        during_hi = max(f.back, f.killed + 1.0)
        before = window(calls, f.killed - span, f.killed)
        during = window(calls, f.killed, during_hi)
        after = window(calls, during_hi, during_hi + span)
        first_ok = min((c["end"] for c in calls if c["status"] == "ok" and c["start"] >= f.killed), default=None)
        failed = sum(c["status"] != "ok" for c in calls if f.killed <= c["end"] < during_hi + span)
        v0, v1 = run.monitor.version_at(f.killed), run.monitor.version_at(during_hi + a.settle)
        table.add_row(f.what, f"+{f.killed - run.started:.0f} s", f"{f.back - f.killed:.1f} s",
                      "-" if f.recovered is None else f"{f.recovered - f.killed:.1f} s",
                      "-" if first_ok is None else f"{first_ok - f.killed:.2f} s",
                      f"{before[0]:.2f}", f"{during[0]:.2f}", f"{after[0]:.2f}",
                      _ms(before[1]), _ms(during[1]), _ms(after[1]), str(failed), f"v{v0} → v{v1}")
    return table


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


def plot(run: Run, calls: list[dict[str, Any]], recorded: list[ModelCall], out: Path, console: Console) -> None:
    """Calls/s (the harnesses' and tether.calls') over 2 s bins above, p99 and p50 latency over 5 s bins below,
    each fault shaded from the kill until the part was back."""
    plt = pyplot()
    t0 = run.started
    end = max((c["end"] for c in calls), default=t0) - t0
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    _throughput(top, calls, recorded, t0, end)
    _latency(bottom, calls, t0, end)
    for f in run.faults:
        for ax in (top, bottom):
            ax.axvspan(f.killed - t0, max(f.back, f.killed + 1) - t0, color="#f90", alpha=0.25)
        top.annotate(f.name, (f.killed - t0, top.get_ylim()[1] * 0.95), fontsize=7, rotation=90, va="top")
    fig.suptitle("chaos: SIGKILLs under load (orange: kill → restarted)")
    save(fig, out, console)


def _throughput(ax: Any, calls: list[dict[str, Any]], recorded: list[ModelCall], t0: float, end: float) -> None:
    bin_s = 2.0
    bins = [i * bin_s for i in range(int(end / bin_s) + 2)]
    ok = [c["end"] - t0 for c in calls if c["status"] == "ok"]
    gw = [c.timings.finished_at.timestamp() - t0 for c in recorded if c.status == "ok"]
    ax.hist(ok, bins=bins, weights=[1 / bin_s] * len(ok), histtype="step", color="#3a7", label="harnesses: ok")
    ax.hist(gw, bins=bins, weights=[1 / bin_s] * len(gw), histtype="step", color="#37a", linestyle="--",
            label="tether.calls: ok ModelCalls")
    bad = [c["end"] - t0 for c in calls if c["status"] != "ok"]
    if bad:
        ax.plot(bad, [0] * len(bad), "rx", label="failed calls")
    ax.set(ylabel="calls / s")
    ax.legend(loc="upper right", fontsize=8)


def _latency(ax: Any, calls: list[dict[str, Any]], t0: float, end: float) -> None:
    lat_bin = 5.0
    xs, p99s, p50s = [], [], []
    for i in range(int(end / lat_bin) + 1):
        lat = sorted((c["end"] - c["start"]) * 1000 for c in calls
                     if c["status"] == "ok" and i * lat_bin <= c["end"] - t0 < (i + 1) * lat_bin)
        if lat:
            xs.append((i + 0.5) * lat_bin)
            p99s.append(lat[min(len(lat) - 1, int(0.99 * len(lat)))])
            p50s.append(lat[len(lat) // 2])
    ax.plot(xs, p99s, color="#a33", label="p99")
    ax.plot(xs, p50s, color="#999", label="p50")
    ax.set(yscale="log", ylabel="latency ms (harness, 5 s bins)", xlabel="seconds since the controller started")
    ax.legend(loc="upper right", fontsize=8)
