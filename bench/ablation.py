"""The seed system's ablation, reproduced: advantage level by loss normalisation on the multi-call lookup task.

    advantage  sample   each recorded call a member of its task's group (GRPO over the calls)
               rollout  the task-level advantage Tether uses (GRPO over the task's rollouts)
    loss       token-mean  every trainable token of the batch weighs the same
               per-task    every task weighs the same, and each rollout the same within it

Four arms, `--seeds` seeds each, the same updates and the same held-out
validation (greedy, every `--validate-every` updates, and the first and the
last). Each run starts from the same format-only warm start and trains the
torch learner (`trainer/learner.py`: the real batch, loss and optimiser) on
episodes of the demo agent run in this process (`bench/_agent_loop.py`),
so one seed of the four arms took 44 min in one process on two cores shared with
the test suite (2026-12-06: 510-870 s a run), the twelve runs about 66 min as two
processes, after 20 min to make the warm model the first time. It prints a table
(final and best validation reward, area under the validation curve, entropy
mean and trend, updates with no signal, tokens and samples per task) with the
spread over seeds, and plots validation reward and entropy per update for the
four arms.

    python bench/ablation.py                      # 4 arms x 3 seeds
    python bench/ablation.py --seeds 1 --updates 10 --arms rollout/per-task   # a quick look
    python bench/ablation.py --seeds 0            # the warm model only; then split the arms
                                                  # over processes with --warm and --out, and --merge
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from _agent_loop import AGENT, TASK, Agents, Episode, held_out, task_group
from rich.console import Console
from rich.table import Table
from transformers import AutoTokenizer

from tether.demo import FILL_CAP, PRESETS
from trainer.advantages import ScoredGroups, calls_of
from trainer.config import TrainerConfig
from trainer.learner import TorchLearner
from trainer.selection import batch_size, select, verdict

from _shared import RESULTS, pyplot

ARMS = ("sample/token-mean", "sample/per-task", "rollout/token-mean", "rollout/per-task")
SEED_CLAIM = "rollout/per-task"  # the seed system's winner: task-level advantage with per-task normalisation
PRESET = PRESETS["lookup"]  # the defaults are the demo's: the bench measures the recipe the demo runs


@dataclass
class Curve:
    """One run: validation per version, and per update the numbers the table summarises."""
    arm: str
    seed: int
    validation: list[tuple[int, float]] = field(default_factory=list)
    by_depth: list[tuple[int, dict[str, float]]] = field(default_factory=list)  # validation per lookup depth
    entropy: list[float] = field(default_factory=list)
    reward: list[float] = field(default_factory=list)
    tokens_per_task: list[float] = field(default_factory=list)
    samples_per_task: list[float] = field(default_factory=list)
    groups_sampled: list[int] = field(default_factory=list)  # per update: with fill signal, B or more
    seconds: float = 0.0


def warm_model(home: Path, copy_steps: int, steps: int, max_turns: int, console: Console) -> Path:
    """The tiny model taught to copy (tether/copying.py), then warm-started on the lookup task's format only; each
    reused while its recipe is unchanged."""
    from tether.copying import teach_copying
    from tether.supervised import fit, recipe
    from tether.tiny_model import init_tiny
    from tether.warm_start import warm_start

    tiny = home / "tiny"
    if not (tiny / "tokenizer.json").exists():
        init_tiny(tiny)
    base = home / f"tiny-copying-{copy_steps}-{recipe(*(Path(f.__code__.co_filename) for f in (teach_copying, fit)))}"
    if copy_steps and not (base / "copying.json").exists():
        _, losses, seconds = teach_copying(
            tiny, base, steps=copy_steps,
            on_step=lambda i, loss: console.print(f"copying {i + 1}/{copy_steps} loss {loss:.3f}") if i % 100 == 99
            else None)
        (base / "copying.json").write_text(json.dumps({"losses": losses, "seconds": seconds}))
    start = base if copy_steps else tiny
    sources = [Path(warm_start.__code__.co_filename), Path(fit.__code__.co_filename), Path(TASK.__file__ or "")]
    out = home / f"warm-lookup-{steps}-{recipe(*sources)}-from-{start.name}"
    if (out / "warm_start.json").exists():
        return out
    started = time.perf_counter()
    _, losses, seconds = warm_start(
        start, out, AGENT.SYSTEM, AGENT.TOOLS, steps=steps, seed=0,
        turns=lambda rng: TASK.random_turns(rng, TASK.task(rng, -1), max_turns),
        on_step=lambda i, loss: console.print(f"warm-start {i + 1}/{steps} loss {loss:.3f}") if i % 50 == 49 else None)
    (out / "warm_start.json").write_text(json.dumps({"losses": losses, "seconds": seconds}))
    console.print(f"warm-start: {steps} steps in {time.perf_counter() - started:.0f} s, loss {losses[0]:.3f} → "
                  f"{losses[-1]:.3f}")
    return out


def validate(agents: Agents, tasks: list[dict[str, Any]], version: int) -> tuple[float, dict[str, float]]:
    """Mean greedy reward over the held-out tasks, and per depth (which chains the policy has learned to follow)."""
    episodes = agents.run(tasks, 0.0, version, seed=0)
    depths: dict[str, list[float]] = {}
    for e in episodes:
        depths.setdefault(str(e.task["depth"]), []).append(e.reward or 0.0)
    return (sum(e.reward or 0.0 for e in episodes) / len(episodes),
            {d: statistics.fmean(r) for d, r in sorted(depths.items())})


def train(arm: str, seed: int, warm: Path, args: argparse.Namespace, console: Console) -> Curve:
    """One run of one arm: `updates` updates of B groups of K rollouts, validated at the cadence."""
    level, loss_mode = arm.split("/")
    torch.manual_seed(seed)
    config = TrainerConfig(run_id=f"ablation-{arm.replace('/', '-')}-{seed}", model=warm, lr=args.lr, kl_coef=args.kl,
                           epochs=args.epochs, loss_mode=loss_mode, advantage_level=level, zero_variance="drop",
                           batch_groups=args.batch_groups, seed=seed, device=args.device,
                           temperature=args.temperature, adam_eps=args.adam_eps)
    learner = TorchLearner.load(config, torch.device(args.device), None)
    tokenizer = AutoTokenizer.from_pretrained(warm)
    agents = Agents(learner.model, tokenizer, max_turns=args.max_turns)
    held = held_out(10_000, args.held_out)
    rng = random.Random(seed)
    curve = Curve(arm, seed)
    started = time.perf_counter()
    for version in range(args.updates + 1):
        if version % args.validate_every == 0 or version == args.updates:
            learner.model.train(False)
            value, by_depth = validate(agents, held, version)
            curve.validation.append((version, value))
            curve.by_depth.append((version, by_depth))
            console.print(f"  {arm} seed {seed} v{version}: validation {value:.3f}, by depth "
                          + " ".join(f"{d}:{v:.2f}" for d, v in by_depth.items())
                          + f", {time.perf_counter() - started:.0f} s", highlight=False)
        if version == args.updates:
            break
        groups, episodes = sample(agents, config, rng, version, seed, args)
        chosen = select(groups, version, max_staleness=0, zero_variance="drop", recipe=config.advantage)
        learner.model.train()
        if chosen.groups:
            entropy = learner.update(ScoredGroups.of(chosen.groups, config.advantage), version).entropy
        else:  # every group all 0 or all 1: nothing to learn from, and no entropy measured
            entropy = math.nan
        _record(curve, entropy, groups, episodes)
        if version % 5 == 0:
            console.print(f"  {arm} seed {seed} update {version + 1}/{args.updates}: batch reward "
                          f"{curve.reward[-1]:.3f}, entropy {entropy:.3f}, validation "
                          f"{curve.validation[-1][1]:.3f} (v{curve.validation[-1][0]}), "
                          f"{time.perf_counter() - started:.0f} s")
    curve.seconds = time.perf_counter() - started
    return curve


def sample(agents: Agents, config: TrainerConfig, rng: random.Random, version: int, seed: int,
           args: argparse.Namespace) -> tuple[list[Any], list[Episode]]:
    """One update's task groups, filled as the trainer fills them (`trainer.selection.batch_size`): B at a time
    until the rule says enough. The groups past the rule's count are dropped (the stack would keep them for the
    next update, at most B - 1 of them)."""
    groups: list[Any] = []
    episodes: list[Episode] = []
    cap = args.batch_groups * FILL_CAP
    while True:
        chunk = len(groups) // args.batch_groups
        tasks = [TASK.task(rng, (version * FILL_CAP + chunk) * args.batch_groups + i,
                           depth=rng.choice(args.train_depths)) for i in range(args.batch_groups)]
        episodes += agents.run([t for t in tasks for _ in range(args.group_size)], args.temperature, version,
                               seed=seed * 100_003 + version + 10_007 * chunk)
        groups += [task_group(f"{config.run_id}.{t['id']}", t, episodes[-len(tasks) * args.group_size:][
            i * args.group_size:(i + 1) * args.group_size]) for i, t in enumerate(tasks)]
        taken = batch_size([verdict(g, version, 0, config.advantage) for g in groups], args.batch_groups,
                           args.fill, cap)
        if taken is not None:
            return groups[:taken], episodes[:taken * args.group_size]


def _record(curve: Curve, entropy: float, groups: list[Any], episodes: list[Episode]) -> None:
    curve.groups_sampled.append(len(groups))
    curve.entropy.append(entropy)
    curve.reward.append(sum(e.reward or 0.0 for e in episodes) / len(episodes))
    tokens = [sum(sum(s.loss_mask) for r in g.rollouts for s in r.segments) for g in groups]
    samples = [sum(calls_of(r) for r in g.rollouts) for g in groups]
    curve.tokens_per_task.append(statistics.fmean(tokens))
    curve.samples_per_task.append(statistics.fmean(samples))


def _measured(values: list[float]) -> list[float]:
    return [v for v in values if not math.isnan(v)]


def _slope(values: list[float]) -> float:
    """Least-squares slope per update over the updates that measured one: the entropy's trend."""
    points = [(i, v) for i, v in enumerate(values) if not math.isnan(v)]
    if len(points) < 2:
        return 0.0
    mean_x, mean_y = statistics.fmean(i for i, _ in points), statistics.fmean(v for _, v in points)
    return (sum((i - mean_x) * (v - mean_y) for i, v in points)
            / sum((i - mean_x) ** 2 for i, _ in points))


def _spread(values: list[float]) -> str:
    mean = statistics.fmean(values)
    return f"{mean:.3f} ± {statistics.pstdev(values):.3f}" if len(values) > 1 else f"{mean:.3f}"


def summary(curves: list[Curve]) -> tuple[Table, dict[str, dict[str, list[float]]]]:
    """The table, mean ± standard deviation over seeds, and its numbers."""
    table = Table(title="Ablation on the lookup task: validation reward (greedy, held-out) and entropy")
    for column in ("arm", "seeds", "final val", "final by depth", "best val", "area (mean val)", "entropy mean",
                   "entropy trend/upd",
                   "no-signal updates", "tokens/task", "samples/task", "s/run"):
        table.add_column(column)
    figures: dict[str, dict[str, list[float]]] = {}
    for arm in ARMS:
        runs = [c for c in curves if c.arm == arm]
        if not runs:
            continue
        f = figures[arm] = {
            "final": [c.validation[-1][1] for c in runs], "best": [max(v for _, v in c.validation) for c in runs],
            "area": [statistics.fmean(v for _, v in c.validation) for c in runs],
            "entropy": [statistics.fmean(_measured(c.entropy) or [math.nan]) for c in runs],
            "trend": [_slope(c.entropy) for c in runs],
            "tokens": [statistics.fmean(c.tokens_per_task) for c in runs],
            "samples": [statistics.fmean(c.samples_per_task) for c in runs], "seconds": [c.seconds for c in runs],
            "no_signal": [float(sum(math.isnan(e) for e in c.entropy)) for c in runs]}
        final_depths = [c.by_depth[-1][1] for c in runs if c.by_depth]
        depths = " ".join(f"{d}:{statistics.fmean(f[d] for f in final_depths):.2f}"
                          for d in sorted({d for f in final_depths for d in f}))
        table.add_row(arm + (" (seed system's)" if arm == SEED_CLAIM else ""), str(len(runs)), _spread(f["final"]),
                      depths, *(_spread(f[k]) for k in ("best", "area", "entropy")),
                      f"{statistics.fmean(f['trend']):+.4f}",
                      " ".join(f"{n:.0f}" for n in f["no_signal"]), f"{statistics.fmean(f['tokens']):.0f}",
                      f"{statistics.fmean(f['samples']):.1f}", f"{statistics.fmean(f['seconds']):.0f}")
    return table, figures


def plot(curves: list[Curve], out: Path) -> Path:
    plt = pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    for arm, colour in zip(ARMS, ("#c73", "#e9a", "#37a", "#3a7"), strict=True):
        runs = [c for c in curves if c.arm == arm]
        if not runs:
            continue
        versions = [v for v, _ in runs[0].validation]
        values = [[c.validation[i][1] for c in runs] for i in range(len(versions))]
        top.plot(versions, [statistics.fmean(v) for v in values], "o-", color=colour, label=arm)
        top.fill_between(versions, [min(v) for v in values], [max(v) for v in values], color=colour, alpha=0.15)
        steps = range(1, len(runs[0].entropy) + 1)
        per_step = [_measured([c.entropy[i] for c in runs]) or [math.nan] for i in range(len(runs[0].entropy))]
        bottom.plot(steps, [statistics.fmean(v) for v in per_step], "-", color=colour, label=arm)
        bottom.fill_between(steps, [min(v) for v in per_step], [max(v) for v in per_step], color=colour, alpha=0.15)
    top.set(ylabel="validation reward (greedy)", title="advantage level / loss normalisation (band: min-max "
                                                        "over seeds)")
    top.legend(fontsize="small")
    bottom.set(xlabel="update", ylabel="policy entropy (nats/token)")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=0, help="Seeds FIRST..FIRST+SEEDS-1 (to split a run).")
    parser.add_argument("--merge", type=Path, nargs="+", metavar="DIR",
                        help="Train nothing: the table and plot of the runs saved in these --out folders.")
    parser.add_argument("--updates", type=int, default=14)
    parser.add_argument("--validate-every", type=int, default=2)
    parser.add_argument("--batch-groups", type=int, default=4, help=(
        "B: tasks per update (the demo takes 8; 4 keeps the twelve runs near 90 minutes here)"))
    parser.add_argument("--group-size", type=int, default=PRESET["group_size"], help="K: rollouts per task.")
    parser.add_argument("--fill", choices=("groups", "signal"), default=PRESET["fill"], help=(
        f"groups: B groups per update; signal: B at a time until B have rewards that differ, at most "
        f"{FILL_CAP} B"))
    parser.add_argument("--adam-eps", type=float, default=PRESET["adam_eps"])
    parser.add_argument("--held-out", type=int, default=48, help="Validation tasks.")
    parser.add_argument("--max-turns", type=int, default=PRESET["max_turns"])
    parser.add_argument("--lr", type=float, default=PRESET["lr"],
                        help="5e-4 and 1e-3 collapsed to all-zero rewards within 5 updates here")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--kl", type=float, default=0.0, help="KL coefficient to the warm model.")
    parser.add_argument("--temperature", type=float, default=1.0, help="Of the training rollouts (validation: 0).")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--train-depths", type=lambda s: [int(d) for d in s.split(",")],
                        default=PRESET["training_depths"],
                        help="Lookup depths of the training tasks, drawn uniformly from this list (1,2,3,3: half "
                             "of them three lookups deep); the held-out tasks are always uniform over 1, 2, 3.")
    parser.add_argument("--copy-steps", type=int, default=PRESET["copy_steps"],
                        help="Teaching the tiny model to copy, first.")
    parser.add_argument("--warm-steps", type=int, default=PRESET["warm_steps"])
    parser.add_argument("--warm", type=Path, help="A warm-started model to use instead of making one.")
    parser.add_argument("--arms", default=",".join(ARMS), help="Comma-separated, from: " + ", ".join(ARMS))
    parser.add_argument("--out", type=Path, default=RESULTS / "ablation")
    parser.add_argument("--threads", type=int, default=1, help=(
        "torch's threads: one by default, since on a shared two-core machine two threads that must wait for "
        "each other made a step 4-7x slower than one"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    console = Console(width=max(Console().width, 200))  # the table whole, in a log too
    if args.merge:
        saved = [Curve(**c) for d in args.merge for c in json.loads((d / "curves.json").read_text())]
        report(saved, args, console)
        return
    warm = args.warm or warm_model(args.out / "models", args.copy_steps, args.warm_steps, args.max_turns, console)
    console.print(f"warm model: {warm}", highlight=False, soft_wrap=True)
    if args.seeds == 0:  # the model only, for runs split over processes (--warm)
        return
    arms = [a for a in args.arms.split(",") if a]
    unknown = set(arms) - set(ARMS)
    if unknown:
        parser.error(f"unknown arms {sorted(unknown)}; known: {', '.join(ARMS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    curves: list[Curve] = []
    for seed in range(args.first_seed, args.first_seed + args.seeds):  # outermost: if interrupted, arms compare
        for arm in arms:
            curves.append(train(arm, seed, warm, args, console))
            (args.out / "curves.json").write_text(json.dumps([asdict(c) for c in curves]))
    report(curves, args, console)


def report(curves: list[Curve], args: argparse.Namespace, console: Console) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    table, figures = summary(curves)
    console.print(table)
    (args.out / "summary.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                      "figures": figures}, indent=1))
    console.print(f"plot: {plot(curves, args.out / 'ablation.png')}")


if __name__ == "__main__":
    main()
