"""Which injected bugs make tasks, and what the agent is told about them. Pure.

A candidate is kept when at least one test fails with the bug and passes
without it (FAIL_TO_PASS), its results were the same on both runs, no more
than `max_failing` tests break, and no kept bug has the same diff. The problem
statement says what a user would see, the failing tests and their messages,
never the diff.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass

from swe.testrun import TestReport

MESSAGE_LINES = 6  # of each failing test's message in a problem statement
STATED_TESTS = 5  # failing tests a problem statement names at most


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    fail_to_pass: tuple[str, ...] = ()
    pass_to_pass: tuple[str, ...] = ()
    rejected: str | None = None  # why the candidate makes no task


def judge(baseline: TestReport, runs: Sequence[TestReport], max_failing: int) -> Verdict:
    """The candidate's tests, from the clean baseline and its runs with the bug (two, for stability)."""
    if any(r.timed_out for r in runs):
        return Verdict(rejected="its tests timed out")
    if any(r.passed != runs[0].passed for r in runs[1:]):
        return Verdict(rejected="its tests are not stable: two runs gave different results")
    broken = sorted(baseline.passed - runs[0].passed)
    if not broken:
        return Verdict(rejected="no test fails with the bug")
    if len(broken) > max_failing:
        return Verdict(rejected=f"{len(broken)} tests fail with the bug, more than {max_failing}")
    return Verdict(fail_to_pass=tuple(broken), pass_to_pass=tuple(sorted(baseline.passed & runs[0].passed)))


def patch(path: str, before: str, after: str) -> str:
    """A unified diff of one file, as `git apply` takes it."""
    lines = difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                 f"a/{path}", f"b/{path}")
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)


def problem_statement(package: str, fail_to_pass: Sequence[str], messages: dict[str, str]) -> str:
    """What a user reports: which tests fail and how, in the package's own words (its assertion messages)."""
    shown = list(fail_to_pass[:STATED_TESTS])
    parts = [f"Some of {package}'s tests fail and should pass. Find the cause in the library's source and fix it "
             "there; the tests themselves are right.", "", "Failing tests:"]
    for test in shown:
        message = "\n".join(messages.get(test, "").strip().splitlines()[:MESSAGE_LINES])
        parts.append(f"- {test}")
        if message:
            parts.extend("    " + line for line in message.splitlines())
    if len(fail_to_pass) > len(shown):
        parts.append(f"- and {len(fail_to_pass) - len(shown)} more")
    return "\n".join(parts) + "\n"
