"""`tether swe grade`: a rollout's change, graded where it cannot have reached (docs/architecture.md, "Coding tasks").

The change is the difference between the rollout's folder and the buggy tree
rebuilt from the task's own data (never the folder's git history). Only
library source files are taken: tests, test settings, interpreter hooks and
anything else are dropped and reported. Grading runs in a fresh copy of the
buggy tree, the original tests untouched, with the tests' results read from
pytest's own report (`swe.testrun`). Reward 1 only if every FAIL_TO_PASS and
PASS_TO_PASS test passes; the fraction that did is recorded too.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from swe.build import Instance, is_test_file
from swe.errors import SweError
from swe.sources import commit_tree
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
    isolated: bool = False


def checkout(instance: Instance, base: Path, to: Path) -> Path:
    """The buggy tree at `to`, a repository of one commit: what a rollout starts from."""
    if to.exists() and any(to.iterdir()):
        raise SweError(f"{to}: the folder exists and is not empty")
    to.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(base, to, ignore=shutil.ignore_patterns(".git"), dirs_exist_ok=True)
    applied = subprocess.run(["git", "apply", "--whitespace=nowarn", "-"], input=instance.bug_patch, text=True,
                             cwd=to, capture_output=True, timeout=60)
    if applied.returncode != 0:
        raise SweError(f"instance {instance.id}: its bug does not apply to {base}: {applied.stderr.strip()}")
    return commit_tree(to, f"{instance.package}")


def grade(instance: Instance, base: Path, workdir: Path, *, timeout_s: float) -> Grade:
    tests = [*instance.fail_to_pass, *instance.pass_to_pass]
    link = _link_on_the_way(workdir)
    if link is not None:  # the working copy swapped for a link: to the clean tree, say, which the agent can name
        return Grade(reward=0.0, passed=0.0, failed_tests=tests, dropped={
            str(workdir): f"the working copy is reached through a symbolic link ({link}): not graded"})
    with tempfile.TemporaryDirectory(prefix="tether-swe-grade-") as scratch:
        reference = checkout(instance, base, Path(scratch) / "reference")
        taken, dropped = _change(reference, workdir)
        graded = Path(shutil.copytree(reference, Path(scratch) / "graded", symlinks=True))  # the buggy tree, again
        for path, text in taken.items():
            target = graded / path
            if text is None:
                target.unlink(missing_ok=True)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text)
        report = run_tests(graded, timeout_s=timeout_s, tests=tests)
    failed = [t for t in tests if not report.outcome(t)]
    passed = (len(tests) - len(failed)) / len(tests)
    return Grade(reward=1.0 if not failed else 0.0, passed=passed, failed_tests=failed, taken=sorted(taken),
                 dropped=dropped, isolated=report.isolated)


def _link_on_the_way(workdir: Path) -> Path | None:
    """The first symbolic link on the way to `workdir`, if any (the current folder's own path is a real one)."""
    here, path = Path.cwd(), Path(os.path.abspath(workdir))
    for step in [*reversed(path.parents), path]:
        if step != here and step not in here.parents and step.is_symlink():
            return step
    return None


def _change(reference: Path, workdir: Path) -> tuple[dict[str, str | None], dict[str, str]]:
    """The library source files the rollout changed (new text, or None when deleted), and the others it touched
    with why they are not taken."""
    before, after = dict(_files(reference)), dict(_files(workdir))
    taken: dict[str, str | None] = {}
    dropped = {str(p.relative_to(workdir)): "a symbolic link" for p in workdir.rglob("*") if p.is_symlink()}
    for path in sorted(before.keys() | after.keys()):
        old, new = before.get(path), after.get(path)
        if old == new or path in dropped:
            continue
        reason = _refusal(Path(path), old, new)
        if reason is not None:
            dropped[path] = reason
        else:
            taken[path] = None if new is None else new.decode()
    return taken, dropped


def _refusal(path: Path, old: bytes | None, new: bytes | None) -> str | None:
    """Why a changed file is not graded, or None to take it."""
    if path.name in HOOKS:
        return "test or interpreter settings"
    if path.suffix == ".pth":
        return "a .pth file runs code when Python starts"
    if is_test_file(path):
        return "a test file: the original tests are graded"
    if path.suffix != ".py":
        return "not a Python source file"
    if new is not None and _always_equal(new) > _always_equal(old):
        return "it adds an equality operator or mock.ANY: an injected bug is fixed without new ones"
    return None


#: what makes an object equal to anything: a fix of a one-place bug needs none that the file did not have
ALWAYS_EQUAL = (b"__eq__", b"__ne__", b"ANY", b"unittest.mock", b"unittest import mock")


def _always_equal(source: bytes | None) -> int:
    return sum((source or b"").count(token) for token in ALWAYS_EQUAL)


def _files(root: Path) -> Iterator[tuple[str, bytes]]:
    for path in root.rglob("*"):
        relative = path.relative_to(root)
        if path.is_file() and not path.is_symlink() and not IGNORED_PARTS & set(relative.parts) \
                and path.suffix != ".pyc":
            yield str(relative), path.read_bytes()
