"""`tether swe build`: a package's source → validated, cleaned coding tasks (docs/architecture.md, "Coding tasks").

    DIR/base/                    the package at its release, a repository of one commit
    DIR/tasks.jsonl              what a rollout may see: id, problem statement, package
    DIR/private/instances.jsonl  what only the grader sees: the bug, the gold patch, the tests
    DIR/private/behaviour/ID.json each task's behaviour check: inputs and the original's answers (swe.behaviour)
    DIR/build.json               how the build went: candidates, kept, rejected and why, seconds
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from swe import behaviour
from swe.errors import BuildError
from swe.instances import judge, patch, problem_statement
from swe.mutations import Mutant, mutants
from swe.sources import fetch_sdist, unpack
from swe.testrun import TestReport, run_tests

Say = Callable[[str], None]
SLOWER, SLOWER_S = 4.0, 20.0  # a candidate's test run may take 4x the clean one's, and at least 20 s


@dataclass(frozen=True, slots=True, kw_only=True)
class Instance:
    id: str
    package: str
    file: str
    kind: str
    function: str
    bug_patch: str  # base → buggy
    gold_patch: str  # buggy → base
    fail_to_pass: list[str]
    pass_to_pass: list[str]
    problem: str


def is_test_file(path: Path) -> bool:
    parts = path.parts
    return any(p in ("tests", "test", "testing") for p in parts[:-1]) or path.name.startswith("test_") \
        or path.name.endswith("_test.py") or path.name in ("conftest.py", "setup.py")


def source_files(base: Path) -> list[Path]:
    """The library's own modules (not its tests, build scripts or docs), relative to `base`."""
    return sorted(p.relative_to(base) for p in base.rglob("*.py")
                  if ".git" not in p.parts and not is_test_file(p.relative_to(base))
                  and p.relative_to(base).parts[0] not in ("docs", "doc", "examples", "benchmarks"))


def build(requirement: str, out: Path, *, cache: Path, max_candidates: int, max_failing: int, seed: int,
          timeout_s: float, say: Say) -> list[Instance]:
    started = time.perf_counter()
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    base = unpack(fetch_sdist(requirement, cache), out / "base")
    clean_started = time.perf_counter()
    baseline = [run_tests(base, timeout_s=timeout_s) for _ in range(2)]
    # A bug that makes the tests loop is given a few times what the clean suite took, not the whole limit.
    timeout_s = min(timeout_s, max(SLOWER_S, SLOWER * (time.perf_counter() - clean_started) / 2))
    if not baseline[0].passed:
        first = next(iter(baseline[0].failed.items()), None)
        raise BuildError(f"{requirement}: no test passes on the clean tree"
                         + (f" ({len(baseline[0].failed)} failed; {first[0]}: {first[1][:300]})" if first else
                            " (pytest collected none, or could not run: is pytest's version one its tests take?)"))
    if baseline[0].passed != baseline[1].passed:
        raise BuildError(f"{requirement}: its tests do not pass the same way twice on a clean tree "
                         f"({len(baseline[0].passed)} then {len(baseline[1].passed)} passed)")
    say(f"{requirement}: {len(baseline[0].passed)} tests pass on the clean tree"
        f"{'' if baseline[0].isolated else ' (no network namespace here: tests ran with the network)'}")
    candidates = [(path, m) for path in source_files(base) for m in mutants((base / path).read_text())]
    random.Random(seed).shuffle(candidates)
    candidates = candidates[:max_candidates]
    kept: list[Instance] = []
    buggy: dict[str, str] = {}  # a kept instance's id → its file with the bug
    diffs: set[str] = set()
    reasons: Counter[str] = Counter()
    said = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tether-swe-build-") as scratch:
        work = Path(shutil.copytree(base, Path(scratch) / "work", ignore=shutil.ignore_patterns(".git")))
        for n, (path, mutant) in enumerate(candidates, 1):
            instance, reason = _try(requirement, work, path, mutant, baseline[0], max_failing, timeout_s)
            if instance is not None and instance.bug_patch in diffs:
                instance, reason = None, "the same diff as a kept bug"
            if instance is None:
                reasons[reason or "?"] += 1
            else:
                diffs.add(instance.bug_patch)
                kept.append(instance)
                buggy[instance.id] = mutant.source
            if n % 10 == 0 or n == len(candidates) or time.perf_counter() - said > 15:
                said = time.perf_counter()
                say(f"{n}/{len(candidates)} candidates, {len(kept)} kept ({said - started:.0f} s)")
        checks = _behaviour_checks(base, work, kept, buggy, timeout_s, seed, say)
    _write(out, kept, checks, {"package": requirement, "candidates": len(candidates), "kept": len(kept),
                       "rejected": dict(reasons), "tests": len(baseline[0].passed),
                       "seconds": round(time.perf_counter() - started, 1),
                       "network isolated": baseline[0].isolated,
                       "behaviour checks": len(checks),
                       "behaviour checks that tell the bug on inputs no test uses":
                           sum(c.telling > 0 for c in checks.values())})
    return kept


def _behaviour_checks(base: Path, work: Path, kept: list[Instance], buggy: dict[str, str], timeout_s: float,
                      seed: int, say: Say) -> dict[str, behaviour.Checks]:
    """Each kept task's behaviour check (`swe.behaviour`), from one recorded run of the clean tree's tests."""
    if not kept:
        return {}
    recorded = behaviour.record(base, sorted({(i.file, i.function) for i in kept}), timeout_s=timeout_s * 4,
                                seed=seed)
    checks: dict[str, behaviour.Checks] = {}
    for instance in kept:
        seen, variants = recorded.get((instance.file, instance.function), ([], []))
        target = work / instance.file
        clean = target.read_text()
        try:
            target.write_text(buggy[instance.id])
            found = behaviour.prepare(base, work, instance.file, instance.function, seen, variants,
                                      timeout_s=timeout_s)
        finally:
            target.write_text(clean)
        if found is not None:
            checks[instance.id] = found
    say(f"behaviour checks: {len(checks)} of {len(kept)} tasks, "
        f"{sum(c.telling > 0 for c in checks.values())} telling the bug on inputs no test uses")
    return checks


def _try(requirement: str, work: Path, path: Path, mutant: Mutant, baseline: TestReport, max_failing: int,
         timeout_s: float) -> tuple[Instance | None, str | None]:
    target = work / path
    clean = target.read_text()
    try:
        target.write_text(mutant.source)
        first = run_tests(work, timeout_s=timeout_s)
        verdict = judge(baseline, [first], max_failing)
        if verdict.rejected is None:  # a second run only for a bug worth keeping
            verdict = judge(baseline, [first, run_tests(work, timeout_s=timeout_s)], max_failing)
    finally:
        target.write_text(clean)
    if verdict.rejected is not None:
        return None, verdict.rejected
    bug = patch(str(path), clean, mutant.source)
    return Instance(
        id=f"{requirement.replace('==', '-')}-{hashlib.sha256(bug.encode()).hexdigest()[:10]}",
        package=requirement, file=str(path), kind=mutant.kind, function=mutant.function, bug_patch=bug,
        gold_patch=patch(str(path), mutant.source, clean), fail_to_pass=list(verdict.fail_to_pass),
        pass_to_pass=list(verdict.pass_to_pass),
        problem=problem_statement(requirement.partition("==")[0], verdict.fail_to_pass, first.failed)), None


def _write(out: Path, kept: list[Instance], checks: dict[str, behaviour.Checks],
           figures: dict[str, object]) -> None:
    (out / "private").mkdir()
    for id_, found in checks.items():
        found.save(behaviour.checks_path(out, id_))
    with (out / "tasks.jsonl").open("w") as tasks, (out / "private" / "instances.jsonl").open("w") as private:
        for instance in kept:
            tasks.write(json.dumps({"id": instance.id, "problem": instance.problem, "package": instance.package})
                        + "\n")
            private.write(json.dumps(asdict(instance)) + "\n")
    (out / "build.json").write_text(json.dumps(figures, indent=1) + "\n")


def load_instances(path: Path) -> dict[str, Instance]:
    return {i["id"]: Instance(**i) for i in map(json.loads, path.read_text().splitlines())}
