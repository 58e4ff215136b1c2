"""`tether swe grade`: a rollout's change, graded where it cannot have reached (docs/architecture.md, "Coding tasks").

The change is the difference between the rollout's folder and the buggy tree
rebuilt from the task's own data (never the folder's git history), read as
bytes by a bounded walk that no tree can crash. Only library source files are
taken (changed ones, and new modules inside the library's packages): tests,
test settings, interpreter hooks and anything else are dropped and reported.
Grading runs in a fresh copy of the buggy tree, the original tests untouched
plus canaries that must fail (`swe.canaries`), with the tasks folder hidden
from the run and the results read from pytest's own report (`swe.testrun`).
Reward 1 only if every FAIL_TO_PASS and PASS_TO_PASS test passes and no
canary did; the fraction that passed is recorded too.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from swe import behaviour, canaries
from swe.build import Instance, is_test_file
from swe.errors import SweError
from swe.reach import TOO_LARGE, beyond
from swe.scratch import scratch
from swe.sources import GIT_SAFE, commit_tree, git_environment
from swe.testrun import run_tests

#: files that change how tests run or what the interpreter loads, whatever folder they sit in
HOOKS = frozenset({"conftest.py", "pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml", "setup.py",
                   "sitecustomize.py", "usercustomize.py", "__init__.pyc", "noxfile.py"})
IGNORED_PARTS = frozenset({".git", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"})


@dataclass(frozen=True, slots=True, kw_only=True)
class Grade:
    reward: float
    passed: float  # the fraction of FAIL_TO_PASS and PASS_TO_PASS tests that passed
    failed_tests: list[str] = field(default_factory=list)
    taken: list[str] = field(default_factory=list)  # the change's files graded
    dropped: dict[str, str] = field(default_factory=dict)  # file → why it was not taken
    isolated: bool = False  # the graded run had no network
    hidden: bool = False  # the graded run saw the task's folder (clean tree, private data) empty
    tampered: str | None = None  # evidence that the graded run's verdicts were forged (a canary gave it away)
    refused: str | None = None  # why the change was not graded at all
    differs: str | None = None  # how the fixed function answers unlike the original (`swe.behaviour`), if it does
    checked: int = 0  # inputs the behaviour check tried (0: the task has none)


def checkout(instance: Instance, base: Path, to: Path) -> Path:
    """The buggy tree at `to`, a repository of one commit: what a rollout starts from."""
    if to.exists() and any(to.iterdir()):
        raise SweError(f"{to}: the folder exists and is not empty")
    to.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(base, to, ignore=shutil.ignore_patterns(".git"), dirs_exist_ok=True)
    applied = subprocess.run(["git", *GIT_SAFE, "apply", "--whitespace=nowarn", "-"], input=instance.bug_patch,
                             text=True, cwd=to, capture_output=True, timeout=60, env=git_environment())
    if applied.returncode != 0:
        raise SweError(f"instance {instance.id}: its bug does not apply to {base}: {applied.stderr.strip()}")
    return commit_tree(to, f"{instance.package}")


def grade(instance: Instance, base: Path, workdir: Path, *, timeout_s: float, unhidden_ok: bool = False) -> Grade:
    """The rollout's change in `workdir`, graded. `unhidden_ok`: grade even where the task's folder cannot be hidden
    from the graded run (no mount namespace here); otherwise that is reward 0, `refused` saying why."""
    tests = [*instance.fail_to_pass, *instance.pass_to_pass]
    link = _link_on_the_way(workdir)
    if link is not None:  # the working copy swapped for a link: to the clean tree, say, which the agent can name
        return Grade(reward=0.0, passed=0.0, failed_tests=tests, dropped={
            str(workdir): f"the working copy is reached through a symbolic link ({link}): not graded"})
    with scratch("tether-swe-grade-") as folder:
        reference = checkout(instance, base, folder / "reference")
        try:
            taken, dropped = _change(reference, workdir, base)
        except (OSError, ValueError, RecursionError) as exc:  # whatever the agent left must not crash the grader
            return Grade(reward=0.0, passed=0.0, failed_tests=tests, refused=f"the change cannot be read: {exc!r}")
        graded = _apply(reference, taken, folder / "graded")
        planted = canaries.plant(graded, instance.fail_to_pass)
        # the task's folder (its clean tree, the private instances) is empty to the run: it can neither read the
        # gold patch nor poison the tree every later grading copies
        report = run_tests(graded, timeout_s=timeout_s, tests=[*tests, *planted.tests], hide=[base.parent],
                           unhidden_ok=unhidden_ok)
        checks = behaviour.Checks.load(behaviour.checks_path(base.parent, instance.id))
        differs = None
        if checks is not None and report.passed >= set(tests) and not report.refused:
            # a copy the test run never touched answers the inputs no test uses
            fresh = _apply(reference, taken, folder / "answering")
            differs = behaviour.check(fresh, checks, timeout_s=timeout_s, hide=[base.parent],
                                      unhidden_ok=unhidden_ok)
    failed = [t for t in tests if not report.outcome(t)]
    passed = (len(tests) - len(failed)) / len(tests)
    tampered = planted.forged(report) or (f"the test report cannot be read: {report.unreadable}"
                                          if report.unreadable else None)
    refused = ("the task's folder cannot be hidden from the graded run here (no mount namespace); "
               "`--unhidden-ok` grades anyway") if report.refused else None
    return Grade(reward=1.0 if not failed and tampered is None and refused is None and differs is None else 0.0,
                 passed=passed, failed_tests=failed, taken=sorted(taken), dropped=dropped, isolated=report.isolated,
                 hidden=report.hidden, tampered=tampered, refused=refused, differs=differs,
                 checked=len(checks.calls) if checks is not None else 0)


def _apply(reference: Path, taken: dict[str, bytes | None], to: Path) -> Path:
    """A copy of the buggy tree with the change's taken files written in."""
    graded = Path(shutil.copytree(reference, to, symlinks=True))
    for path, data in taken.items():
        target = graded / path
        if data is None:
            target.unlink(missing_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
    return graded


def _link_on_the_way(workdir: Path) -> Path | None:
    """The first symbolic link on the way to `workdir`, if any (the current folder's own path is a real one)."""
    here, path = Path.cwd(), Path(os.path.abspath(workdir))
    for step in [*reversed(path.parents), path]:
        if step != here and step not in here.parents and step.is_symlink():
            return step
    return None


def _change(reference: Path, workdir: Path, base: Path) -> tuple[dict[str, bytes | None], dict[str, str]]:
    """The library source files the rollout changed (new bytes, or None when deleted), and the others it touched
    with why they are not taken. `base`: the clean tree, the original of each file."""
    before, _ = walk(reference)
    after, dropped = walk(workdir)
    packages = library_packages(before)
    taken: dict[str, bytes | None] = {}
    for path in sorted(before.keys() | after.keys()):
        old, new = before.get(path), after.get(path)
        if old == new or path in dropped:
            continue
        reason = _refusal(Path(path), old, new, _read(base / path), packages)
        if reason is not None:
            dropped[path] = reason
        else:
            taken[path] = new
    return taken, dropped


def _refusal(path: Path, old: bytes | None, new: bytes | None, original: bytes | None,
             packages: frozenset[Path]) -> str | None:
    """Why a changed file is not graded, or None to take it. `old`: the file as the rollout got it; `original`:
    as the package released it (before the bug)."""
    if path.name in HOOKS:
        return "test or interpreter settings"
    if path.suffix == ".pth":
        return "a .pth file runs code when Python starts"
    if is_test_file(path):
        return "a test file: the original tests are graded"
    if path.suffix != ".py":
        return "not a Python source file"
    if old is None and path.parent not in packages:
        return ("a new module outside the library's packages: it could shadow a module the tests or the tools "
                "import")
    if new is not None:
        added = beyond(new, [old, original])
        if added == [TOO_LARGE]:
            return "far larger than the file it changes (or, new, than a module a fix adds): not screened (swe.reach)"
        if added:
            return (f"it uses {', '.join(f'`{n}`' for n in added[:5])} more than the file did: a fix of the bug "
                    "needs none of that reach (swe.reach)")
    return None


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes() if path.is_file() and not path.is_symlink() else None
    except OSError:
        return None


def library_packages(files: dict[str, bytes]) -> frozenset[Path]:
    """The folders of the clean tree that are the library's packages: they hold an `__init__.py` and no tests. A
    fix may add modules there, and nowhere else."""
    return frozenset(Path(path).parent for path in files
                     if Path(path).name == "__init__.py" and not is_test_file(Path(path)))


#: how deep and how much of a working copy is read: a fix needs neither more folders nor more bytes
MAX_DEPTH, MAX_FILE_BYTES, MAX_TOTAL_BYTES = 64, 8 * 1024 * 1024, 256 * 1024 * 1024


def walk(root: Path) -> tuple[dict[str, bytes], dict[str, str]]:
    """Every regular file under `root` (relative path → bytes), and what was passed over with why: links, files
    too large, folders too deep, what cannot be read. Iterative and bounded: no tree an agent can make crashes it
    (a recursive walk fails on a deep one), and nothing is decoded here."""
    files: dict[str, bytes] = {}
    skipped: dict[str, str] = {}
    stack: list[tuple[Path, int]] = [(root, 0)]
    total = 0
    while stack:
        folder, depth = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError as exc:
            skipped[str(folder.relative_to(root))] = f"cannot be read: {exc.strerror or exc}"
            continue
        for entry in entries:
            path = Path(entry.path)
            relative = str(path.relative_to(root))
            if entry.name in IGNORED_PARTS:
                continue
            try:
                if entry.is_symlink():
                    skipped[relative] = "a symbolic link"
                elif entry.is_dir(follow_symlinks=False):
                    if depth + 1 >= MAX_DEPTH:
                        skipped[relative] = f"a folder more than {MAX_DEPTH} levels deep"
                    else:
                        stack.append((path, depth + 1))
                elif entry.is_file(follow_symlinks=False) and path.suffix != ".pyc":
                    size = entry.stat(follow_symlinks=False).st_size
                    if size > MAX_FILE_BYTES:
                        skipped[relative] = f"over {MAX_FILE_BYTES} bytes"
                    elif total + size > MAX_TOTAL_BYTES:
                        skipped[relative] = f"past the first {MAX_TOTAL_BYTES} bytes of the working copy"
                    else:
                        files[relative] = path.read_bytes()
                        total += size
            except OSError as exc:
                skipped[relative] = f"cannot be read: {exc.strerror or exc}"
    return files, skipped
