"""How far two runs of the same tasks and seeds agree, per harness, with the engine's deterministic mode off and on.

    .venv/bin/python bench/harness_divergence.py [--harnesses openai-agent mini-swe-agent claude-code codex]
        [--modes normal deterministic] [--rollouts 2] [--context 32768] [--max-tokens 256] [--no-pin]

For each mode (the embedded engine on the tiny random model, normal, then
TETHER_ENGINE_DETERMINISTIC) and each harness, unmodified and launched by the
controller from its example run file, two runs (A, then B) of the same tasks
with the same run seed, so every rollout of B has the seed of one of A. The
CLI harnesses run twice more with each rollout's working folder named by its
seed instead of its rollout id (the example's `work/ROLLOUT_ID` puts the run's
name into every prompt that shows the folder). Then `tether diverge`'s
comparison of A and B (repro.diverge): the share of rollouts and calls
identical, of calls the same in tokens (prompt and answer ids, whether or not
the requests were equal: what trains), who diverged first (the harness: its
request differed after equal answers; the engine: the same request got other
tokens), at which call, and the classes of the spans that differed; and
whether the two runs' training data hash alike. The tiny model writes nonsense, so each
harness does what it does with a model that never finishes the task (retries,
format errors, giving up); --max-tokens bounds every answer (Claude Code's and
Codex's included). Writes bench/results/harness_divergence.json and a plot.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

from controller.config import load_config
from controller.main import run
from controller.settings import ControllerSettings
from infra.processes import stop
from repro.read import compare_runs
from schemas.admin import ensure_topics
from schemas.settings import BusSettings
from stream_processors.grouping import Policy

from _shared import ADMIN, SECRET, arguments, pyplot, save, scratch_broker, start_engine, start_gateway

console = Console(width=max(160, shutil.get_terminal_size().columns))
ROOT = Path(__file__).parent.parent
EXAMPLES = ROOT / "examples"
NPM_BIN = EXAMPLES / "npm" / "node_modules" / ".bin"
MODES = ("normal", "deterministic")


@dataclass(frozen=True)
class Harness:
    name: str
    example: str  # the folder under examples/ whose run file and files it runs; "" for the openai-SDK agent
    tasks: list[dict[str, Any]]

    def run_file(self, folder: Path, run_id: str, rollouts: int, max_tokens: int, pinned: Path | None = None
                 ) -> Path:
        """The example's run file in `folder` (with its files), for this run: its id, the bench's group size and
        answer bound, concurrency 2. `pinned`: each rollout works in `pinned/SEED` (emptied first) instead of the
        example's `work/ROLLOUT_ID`, so the two runs' rollouts of one seed see the same path."""
        if self.example:
            shutil.copytree(EXAMPLES / self.example, folder, dirs_exist_ok=True)
            text = (folder / "run.yaml").read_text()
            if pinned is not None:  # paths relative to work/ROLLOUT_ID (its run file's ../../) made absolute
                text = text.replace("mkdir -p work/{rollout_id}", f"rm -rf {pinned}/$TETHER_SEED && mkdir -p "
                                    f"{pinned}/$TETHER_SEED").replace("work/{rollout_id}", f"{pinned}/$TETHER_SEED")
                text = text.replace("../../", f"{folder.absolute()}/")
            config = yaml.safe_load(text)
        else:
            folder.mkdir(parents=True, exist_ok=True)
            config = {"harness": {"command": [sys.executable, str(EXAMPLES / "openai_agent.py"), "--max-turns", "4",
                                              "--max-tokens", str(max_tokens)]}}
        (folder / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in self.tasks))
        config.update(sandbox=False, run_id=run_id, dataset="tasks.jsonl", group_size=rollouts, concurrency=2,
                      timeout_s=900, seed=7)
        if self.name == "claude-code":
            config["harness"]["env"]["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = str(max_tokens)
        (folder / "run.yaml").write_text(yaml.safe_dump(config))
        return folder / "run.yaml"


HELLO = {"id": "hello-file", "problem": "Create a file hello.txt containing the word hi.", "file": "hello.txt",
         "content": "hi"}
HARNESSES = {h.name: h for h in (
    Harness("openai-agent", "", [{"id": "x", "question": "What is x?", "answer": "42"},
                                 {"id": "y", "question": "What is y?", "answer": "7"}]),
    Harness("mini-swe-agent", "mini_swe_agent", [HELLO]),
    Harness("claude-code", "claude_code", [HELLO]),
    Harness("codex", "codex", [HELLO]),
)}


def measure(bus: BusSettings, a: str, b: str) -> dict[str, Any]:
    return asyncio.run(compare_runs(bus, a, b, Policy())).to_json()


def main() -> None:
    parser = arguments(__doc__, "harness_divergence.png")
    parser.add_argument("--harnesses", nargs="+", choices=list(HARNESSES), default=list(HARNESSES))
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--rollouts", type=int, default=2, help="rollouts per task (the group size)")
    parser.add_argument("--context", type=int, default=32768, help="the tiny model's context")
    parser.add_argument("--max-tokens", type=int, default=256, help="the longest answer")
    parser.add_argument("--replot", action="store_true", help="only draw the plot again from the last run's JSON")
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=True,
                        help="also run the CLI harnesses with each rollout's working folder named by its seed")
    args = parser.parse_args()
    if args.replot:
        replot(args.out.with_suffix(".json"), args.out)
        return
    if {"claude-code", "codex"} & set(args.harnesses) and not (NPM_BIN / "claude").exists():
        raise SystemExit(f"the CLIs are not in {NPM_BIN}: run `make harnesses`")
    os.environ["PATH"] = f"{NPM_BIN}:{Path(sys.executable).parent}:{os.environ['PATH']}"

    scratch, broker = scratch_broker("tether-divergence-bench-")
    results: dict[str, dict[str, Any]] = {}
    try:
        from tether.tiny_model import init_tiny

        model = init_tiny(scratch / "tiny", context=args.context)
        broker.start()
        bus = BusSettings(bootstrap_servers=broker.bootstrap)
        asyncio.run(ensure_topics(bus))
        for mode in args.modes:
            engine, engine_process = start_engine("tiny", model, (), scratch, {
                "TETHER_ENGINE_DETERMINISTIC": str(mode == "deterministic").lower(),
                "TETHER_ENGINE_DEFAULT_MAX_TOKENS": str(args.max_tokens)})
            gateway, gateway_process = start_gateway(engine, model, bus, f"divergence-{mode}", scratch)
            settings = ControllerSettings(gateway_url=gateway, gateway_admin_key=ADMIN, gateway_secret=SECRET, bus=bus)
            try:
                for name in args.harnesses:
                    harness = HARNESSES[name]
                    for workdir in ("per rollout", "pinned") if harness.example and args.pin else ("per rollout",):
                        key = f"{name}/{mode}/{workdir}"
                        pinned = scratch / f"pinned-{name}-{mode}" if workdir == "pinned" else None
                        pair = [f"{name}-{mode}-{'pinned-' if pinned else ''}{side}" for side in "ab"]
                        for run_id in pair:
                            config = load_config(harness.run_file(scratch / run_id, run_id, args.rollouts,
                                                                  args.max_tokens, pinned))
                            state = asyncio.run(run(config, settings))
                            statuses = [s.finished.status for s in state.rollouts.values() if s.finished]
                            console.print(f"{run_id}: {len(state.rollouts)} rollouts ({', '.join(sorted(statuses))})")
                        results[key] = measure(bus, *pair)
                        show_one(key, results[key])
            finally:
                stop(gateway_process)
                stop(engine_process)
    finally:
        broker.stop()
        if not os.environ.get("TETHER_BENCH_KEEP"):
            shutil.rmtree(scratch, ignore_errors=True)
    table(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    summary = {k: {f: v[f] for f in v if f != "divergences"} | {"first_divergences": [
        {f: d[f] for f in ("task_id", "call", "side", "why")} | {"spans": d["spans"][:6]} for d in v["divergences"]]}
        for k, v in results.items()}
    args.out.with_suffix(".json").write_text(json.dumps(summary, indent=1))
    console.print(f"figures: {args.out.with_suffix('.json')}")
    plot(results, args.out)


def show_one(key: str, r: dict[str, Any]) -> None:
    for d in r["divergences"][:2]:
        console.print(f"  {key}: {d['task_id']} call #{d['call']}, the {d['side']} first: {d['why']}")
        for span in d["spans"][:4]:
            console.print(f"    {span['kind']}: {span['a'][:70]!r} → {span['b'][:70]!r}")


def _share(n: int, of: int) -> str:
    return f"{n}/{of} ({n / of:.0%})" if of else "0/0"


def table(results: dict[str, dict[str, Any]]) -> None:
    out = Table(title="Two runs of the same tasks and seeds, per harness: deterministic engine mode off and on")
    for column in ("harness", "engine mode", "working folder", "identical rollouts", "identical calls",
                   "same in tokens", "logprobs to the bit", "diverged first", "at call", "classes of what differed",
                   "training data"):
        out.add_column(column, justify="left")
    for key, r in results.items():
        name, mode, workdir = key.split("/")
        sides = ", ".join(f"{k} {v}" for k, v in r["first_diverged"].items()) or "-"
        at = ", ".join(f"#{k}: {v}" for k, v in r["first_call"].items()) or "-"
        classes = ", ".join(f"{k} {v}" for k, v in r["span_classes"].items()) or "-"
        exact = f"{_share(r['exact_calls'], r['identical_calls'])}, drift ≤ {r['max_logprob_drift']:.1e}"
        out.add_row(name, mode, workdir, _share(r["identical_rollouts"], r["pairs"]),
                    _share(r["identical_calls"], r["calls"]), _share(r["same_tokens_calls"], r["calls"]), exact,
                    sides, at, classes,
                    "equal" if r["training_equal"] else "different")
    console.print(out)


def plot(results: dict[str, dict[str, Any]], out: Path) -> None:
    """Left: calls identical as requests and answers; right: calls the same in tokens, each bar marked with
    whether the two runs' training data hash alike."""
    plt = pyplot()
    labels = list(dict.fromkeys(_label(k) for k in results))
    fig, panels = plt.subplots(1, 2, figsize=(13, 4), sharey=True)
    shown = (("identical_calls", "calls identical (request and answer)"),
             ("same_tokens_calls", "calls the same in tokens; training data: = equal, ≠ differs"))
    for ax, (field_, title) in zip(panels, shown, strict=True):
        for m, mode in enumerate(MODES):
            xs = [i + (m - 0.5) * 0.38 for i in range(len(labels))]
            rows = {_label(k): r for k, r in results.items() if k.split("/")[1] == mode}
            values = [rows[label][field_] / rows[label]["calls"] if label in rows and rows[label]["calls"] else 0.0
                      for label in labels]
            ax.bar(xs, values, 0.38, label=mode, color={"normal": "#dd8452", "deterministic": "#4c72b0"}[mode])
            for x, v, label in zip(xs, values, labels, strict=True):
                mark = ("=" if rows[label]["training_equal"] else "≠") if field_ == "same_tokens_calls" and \
                    label in rows else f"{v:.0%}"
                ax.text(x, v, mark, ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(labels)), labels, fontsize=7)
        ax.set_ylim(0, 1.15)
        ax.set_title(title, fontsize=9)
    panels[0].set_ylabel("share of calls, two runs of one seed")
    panels[0].legend(fontsize=8, title="engine mode", title_fontsize=8)
    fig.suptitle("Two runs, the same tasks and seeds, per harness (tiny model, CPU)", fontsize=10)
    save(fig, out, console)


def _label(key: str) -> str:
    name, _, workdir = key.split("/")
    return name if workdir == "per rollout" else f"{name}\n(folder by seed)"


def replot(figures: Path, out: Path) -> None:
    """The plot again from a run's JSON (`--replot`)."""
    plot(json.loads(figures.read_text()), out)


if __name__ == "__main__":
    main()
