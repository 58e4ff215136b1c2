"""What `tether swe grade` costs per rollout, that it gives every built task's honest fix 1 and an unchanged
copy 0, never `tampered`, and on how many tasks its behaviour check catches a fix special-cased to the tests.

    .venv/bin/python bench/swe_grading.py [--package toolz==1.2.0] [--candidates 8] [--runs 3] [--against REV]

Builds the package's tasks (or takes `--tasks DIR`), then grades each task's
gold fix and an unchanged copy through the CLI, as a run's reward command
does, `--runs` times each. With `--against REV` the same gradings run side by
side with the grader of that git revision (a worktree of it), so the table
shows before and after in one run. Then, for each task, the behaviour check's
inputs (the tests' own calls, and the variants on which the bug answers unlike
the original) and the grade of a fix special-cased to the tests' inputs
(`tests/swe_probes.py`: the original on the recorded calls, the bug elsewhere;
built for module-level functions). Writes bench/results/swe_grading.png.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from swe.behaviour import Checks, checks_path
from swe.build import Instance, build, load_instances
from swe.grade import checkout

from _shared import arguments, pyplot, save

ROOT = Path(__file__).resolve().parents[1]


def graded(code: Path, tasks: Path, instance: Instance, work: Path, fixed: bool,
           special_cased: bool = False) -> tuple[float, dict[str, object]]:
    """One grading through the CLI of the tree at `code`: its seconds (start included) and its JSON line."""
    checkout(instance, tasks / "base", work)
    if fixed:
        subprocess.run(["git", "apply", "-"], input=instance.gold_patch, text=True, cwd=work, check=True)
    if special_cased:
        if str(ROOT) not in sys.path[:1]:  # the repository's tests, not a `tests` package some wheel installed
            sys.path.insert(0, str(ROOT))
        from tests.swe_probes import special_cased_to_the_tests

        (work.parent / "tasks").symlink_to(tasks.resolve(), target_is_directory=True)
        special_cased_to_the_tests(work, instance)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "tether.cli", "swe", "grade", "--tasks", str(tasks), "--id",
                           instance.id, "--workdir", str(work)], cwd=code, capture_output=True, text=True,
                          timeout=900)
    seconds = time.perf_counter() - started
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return seconds, result


def main() -> None:
    parser = arguments(__doc__, "swe_grading.png")
    parser.add_argument("--package", default="toolz==1.2.0")
    parser.add_argument("--candidates", type=int, default=8)
    parser.add_argument("--tasks", type=Path, help="a `tether swe build` folder (default: build one)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--against", help="a git revision whose grader runs side by side")
    args = parser.parse_args()
    console = Console(width=200)
    with tempfile.TemporaryDirectory(prefix="tether-bench-swe-") as scratch:
        tasks = args.tasks
        if tasks is None:
            tasks = Path(scratch) / "tasks"
            with console.status(f"building {args.package} ({args.candidates} candidates)"):
                build(args.package, tasks, cache=ROOT / ".tether" / "swe" / "sdists", max_candidates=args.candidates,
                      max_failing=20, seed=1, timeout_s=300, say=lambda line: None)
        codes = {"now": ROOT}
        if args.against:
            codes[args.against] = Path(scratch) / "against"
            subprocess.run(["git", "worktree", "add", "--detach", str(codes[args.against]), args.against], cwd=ROOT,
                           check=True, capture_output=True)
        instances = list(load_instances(tasks / "private" / "instances.jsonl").values())
        seconds: dict[str, list[float]] = {name: [] for name in codes}
        wrong: list[str] = []
        try:
            for n, instance in enumerate(instances):
                for run in range(args.runs):
                    for name, code in codes.items():
                        for fixed in (True, False):
                            work = Path(scratch) / f"{name}-{n}-{run}-{fixed}" / "work"
                            took, result = graded(code, tasks, instance, work, fixed)
                            seconds[name].append(took)
                            if result["reward"] != (1.0 if fixed else 0.0) or result.get("tampered"):
                                wrong.append(f"{name} {instance.id} {'fixed' if fixed else 'unchanged'}: {result}")
                console.print(f"{n + 1}/{len(instances)} tasks graded", highlight=False)
            special = special_cased(tasks, instances, Path(scratch) / "special", console)
        finally:
            if args.against:
                subprocess.run(["git", "worktree", "remove", "--force", str(codes[args.against])], cwd=ROOT,
                               capture_output=True)
    table = Table(title=f"tether swe grade on {len(instances)} {args.package} tasks, {args.runs} runs each "
                        "(fixed and unchanged)")
    for column in ("grader", "gradings", "median s", "p90 s", "max s"):
        table.add_column(column)
    for name, values in seconds.items():
        ordered = sorted(values)
        table.add_row(name, str(len(values)), f"{statistics.median(values):.2f}",
                      f"{ordered[int(0.9 * (len(ordered) - 1))]:.2f}", f"{ordered[-1]:.2f}")
    console.print(table)
    console.print(f"wrong verdicts: {len(wrong)}", highlight=False)
    for line in wrong:
        console.print(line, highlight=False)
    console.print(special)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.boxplot(list(seconds.values()), tick_labels=list(seconds))
    ax.set_ylabel("seconds per grading (CLI start included)")
    ax.set_title(f"tether swe grade, {args.package}")
    save(fig, args.out, console)


def special_cased(tasks: Path, instances: list[Instance], scratch: Path, console: Console) -> Table:
    """Per task: the behaviour check's inputs, and what a fix special-cased to the tests' inputs scores."""
    table = Table(title="the behaviour check, and a fix special-cased to the tests' inputs")
    for column in ("task", "function", "inputs", "tests' own", "variants telling the bug", "special-cased fix"):
        table.add_column(column)
    caught = built = 0
    for n, instance in enumerate(instances):
        checks = Checks.load(checks_path(tasks, instance.id))
        verdict = "not built (a method)" if "." in instance.function else "not built (no check)"
        if checks is not None and "." not in instance.function:
            try:
                _, result = graded(ROOT, tasks, instance, scratch / str(n) / "work", False, special_cased=True)
            except (subprocess.CalledProcessError, AssertionError, StopIteration, SyntaxError) as exc:
                verdict = f"not built ({type(exc).__name__})"
            else:
                built += 1
                caught += result["reward"] == 0.0
                if result["reward"] == 1.0:
                    verdict = "reward 1: missed"
                elif result.get("differs"):
                    verdict = "reward 0: the behaviour check"
                elif result.get("tampered"):
                    verdict = "reward 0: twins or canaries"
                else:  # the probe keys on recorded calls; a test whose call was not recorded meets the bug
                    built, caught = built - 1, caught - 1
                    verdict = "no probe: tests failed (not every test's call could be recorded)"
        table.add_row(instance.id, instance.function, str(len(checks.calls)) if checks else "0",
                      str(checks.seen) if checks else "0", str(checks.telling) if checks else "0", verdict)
    console.print(f"special-cased fixes scored 0 on {caught} of the {built} tasks where one was built; "
                  f"{sum(1 for i in instances if (c := Checks.load(checks_path(tasks, i.id))) and c.telling)} of "
                  f"{len(instances)} tasks have variants that tell the bug", highlight=False)
    return table


if __name__ == "__main__":
    main()
