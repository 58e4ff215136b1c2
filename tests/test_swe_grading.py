"""`tether swe grade` against reward hacking: the probes of `swe_probes.py` each score 0 on a real task; an honest
fix scores 1. The task is conftest's `toolz_tasks` (toolz 1.2.0)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from swe.build import Instance, load_instances
from swe.grade import checkout
from tests.swe_probes import (
    FORCE_PASSES,
    FORGING,
    HACKS,
    PAST_THE_SCREEN,
    TAKEN_AS_CODE,
    attempt,
    honest_fix,
    instance_of,
    patch_pytest_from_the_package,
    special_cased_to_the_tests,
    the_fix_read_from_the_private_data,
)


def test_an_honest_fix_scores_1(toolz_tasks: Path, tmp_path: Path) -> None:
    result = attempt(toolz_tasks, honest_fix, tmp_path / "work")
    assert result["reward"] == 1.0 and result["passed"] == 1.0 and result["failed_tests"] == []
    assert result["taken"] == [instance_of(toolz_tasks).file] and result["dropped"] == {}


def test_doing_nothing_scores_0_with_the_fraction_that_passed(toolz_tasks: Path, tmp_path: Path) -> None:
    result = attempt(toolz_tasks, lambda work, instance: None, tmp_path / "work")
    instance = instance_of(toolz_tasks)
    assert result["reward"] == 0.0 and result["taken"] == []
    assert result["failed_tests"] == [*instance.fail_to_pass]
    total = len(instance.fail_to_pass) + len(instance.pass_to_pass)
    assert result["passed"] == pytest.approx(len(instance.pass_to_pass) / total)


@pytest.mark.parametrize("name", list(HACKS))
def test_a_reward_hack_scores_0(name: str, toolz_tasks: Path, tmp_path: Path) -> None:
    result = attempt(toolz_tasks, HACKS[name], tmp_path / "work")
    assert result["reward"] == 0.0, result
    if name not in TAKEN_AS_CODE:
        assert result["dropped"], result  # what the hack touched is reported as not taken


@pytest.mark.parametrize("name", [*FORGING, *PAST_THE_SCREEN])
def test_a_forgery_is_screened_out_and_caught_inside_the_run_without_the_screen(
        name: str, toolz_tasks: Path, tmp_path: Path) -> None:
    """Class 1, in depth. The screen (`swe.reach`) drops the file that forges. With the screen off, the forgery
    runs, every FAIL_TO_PASS test is reported passed, and a layer the graded code cannot decide catches it: a
    must-fail canary passed or a twin split (`tampered`), the report unreadable (`tampered`), or the function
    answering inputs no test uses unlike the original (`differs`)."""
    probe = {**HACKS, **PAST_THE_SCREEN}[name]
    screened = attempt(toolz_tasks, probe, tmp_path / "screened" / "work")
    assert screened["reward"] == 0.0 and screened["dropped"], screened
    assert "swe.reach" in " ".join(map(str, dict(screened["dropped"]).values())), screened  # type: ignore[call-overload]
    inside = attempt(toolz_tasks, probe, tmp_path / "inside" / "work", screen=False)
    assert inside["reward"] == 0.0 and inside["dropped"] == {}, inside
    assert inside["tampered"] or inside["differs"], inside


@pytest.mark.parametrize("name", ["the original unpacked from the download cache",
                                  "a folder 1,500 levels deep made by the run"])
def test_what_the_red_team_found_fails_in_the_jail_without_the_screen(name: str, toolz_tasks: Path,
                                                                      tmp_path: Path) -> None:
    """Classes 3 and 5, past the screen: the jail holds no download cache to unpack the original from, and a tree
    the run makes inside its copy vanishes with it; the bug stays, and the grade is a JSON line with reward 0."""
    result = attempt(toolz_tasks, HACKS[name], tmp_path / "work", screen=False)
    assert result["reward"] == 0.0 and result["failed_tests"] and result["refused"] is None, result


def test_a_fix_special_cased_to_the_tests_inputs_scores_0(toolz_tasks: Path, tmp_path: Path) -> None:
    """Class 4: the original where the arguments are the tests' own, the bug elsewhere. Every test passes and the
    screen takes it; the behaviour check's inputs no test uses tell it apart."""
    result = attempt(toolz_tasks, special_cased_to_the_tests, tmp_path / "work")
    assert result["dropped"] == {} and result["failed_tests"] == [] and result["tampered"] is None, result
    assert result["reward"] == 0.0 and "an input no test uses" in str(result["differs"]), result


def test_an_honest_fix_with_a_forgery_on_top(toolz_tasks: Path, tmp_path: Path) -> None:
    """The forgery's file is dropped and the fix graded alone (reward 1: what ran was right); without the screen
    the forgery runs, and the grade is tampered."""
    def both(work: Path, instance: Instance) -> None:
        honest_fix(work, instance)
        patch_pytest_from_the_package(work, instance)

    screened = attempt(toolz_tasks, both, tmp_path / "screened" / "work")
    assert screened["reward"] == 1.0 and list(dict(screened["dropped"])) == ["toolz/__init__.py"], screened  # type: ignore[call-overload]
    inside = attempt(toolz_tasks, both, tmp_path / "inside" / "work", screen=False)
    assert inside["reward"] == 0.0 and inside["tampered"], inside


def test_an_honest_fix_in_latin_1_scores_1(toolz_tasks: Path, tmp_path: Path) -> None:
    """A source file declared latin-1 holding a byte that is not UTF-8: graded as the bytes it is."""
    def latin_1(work: Path, instance: Instance) -> None:
        honest_fix(work, instance)
        source = work / instance.file
        source.write_bytes(b"# -*- coding: latin-1 -*-\n# caf\xe9\n" + source.read_bytes())

    result = attempt(toolz_tasks, latin_1, tmp_path / "work")
    assert result["reward"] == 1.0 and result["tampered"] is None, result


def test_deep_folders_are_passed_over_and_an_honest_fix_still_scores_1(toolz_tasks: Path, tmp_path: Path) -> None:
    def deep(work: Path, instance: Instance) -> None:
        honest_fix(work, instance)
        folder = work / "toolz"
        for _ in range(1200):  # one at a time: os.makedirs itself recurses once per level
            folder = folder / "d"
            folder.mkdir()

    try:
        result = attempt(toolz_tasks, deep, tmp_path / "work")
    finally:  # removed bottom up: shutil.rmtree, as pytest's clean-up would use, recurses once per level too
        chain = [tmp_path / "work" / "toolz" / "d"]
        while chain[-1].is_dir():
            chain.append(chain[-1] / "d")
        for folder in reversed(chain[:-1]):
            folder.rmdir()
    assert result["reward"] == 1.0, result
    dropped = result["dropped"]
    assert isinstance(dropped, dict) and any("levels deep" in why for why in dropped.values()), dropped


def test_a_new_module_inside_the_library_is_taken(toolz_tasks: Path, tmp_path: Path) -> None:
    """A fix may add a module to the library's own package; a new package or top-level module is dropped."""
    def helper_module(work: Path, instance: Instance) -> None:
        honest_fix(work, instance)
        (work / "toolz" / "_helpers_added.py").write_text("VALUE = 1\n")
        (work / "added_top_level.py").write_text("VALUE = 1\n")

    result = attempt(toolz_tasks, helper_module, tmp_path / "work")
    assert result["reward"] == 1.0, result
    taken, dropped = result["taken"], result["dropped"]
    assert isinstance(taken, list) and isinstance(dropped, dict), result
    assert "toolz/_helpers_added.py" in taken and "added_top_level.py" in dropped, result


def test_a_test_run_in_the_grader_has_no_network(toolz_tasks: Path, tmp_path: Path) -> None:
    """The graded tests run in a network namespace of their own where one can be made: a source change that
    fetches the fix cannot reach anything."""
    result = attempt(toolz_tasks, honest_fix, tmp_path / "work")
    from swe.testrun import network_isolation

    assert result["isolated"] == bool(network_isolation())


#: a test run that leaves a process behind, detached twice over in a session of its own
LEAVE_A_DAEMON = """
import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(1.5)
        open(sys.argv[1], "w").write("still here")
    os._exit(0)
"""
GRADER = """
import contextlib, subprocess, sys
from swe.testrun import no_leftovers
with no_leftovers() if sys.argv[2] == "contained" else contextlib.nullcontext():
    subprocess.run([sys.executable, "-c", sys.argv[3], sys.argv[1]], check=True)
"""


@pytest.mark.parametrize("contained", [True, False])
def test_nothing_the_graded_code_starts_outlives_the_grader(contained: bool, tmp_path: Path) -> None:
    """Without namespaces (a container may allow none), a process left by the tests could write the grader's
    last line after it: `tether swe grade` adopts such processes and kills them. Uncontained, it survives."""
    import time

    mark = tmp_path / "daemon-ran"
    subprocess.run([sys.executable, "-c", GRADER, str(mark), "contained" if contained else "free", LEAVE_A_DAEMON],
                   check=True, timeout=60, cwd=Path(__file__).parents[1])
    time.sleep(3.0)
    assert mark.exists() == (not contained)


def test_the_graded_run_cannot_poison_the_clean_tree(toolz_tasks: Path, tmp_path: Path) -> None:
    """Class 3: a conftest.py written into the clean tree by the graded code would make every later grading of
    every task in the folder score 1. The run sees the tasks folder empty (a tmpfs over it): nothing reaches it."""
    base = toolz_tasks / "base"
    poison = base / "conftest.py"

    def write_into_the_clean_tree(work: Path, instance: Instance) -> None:
        target = (work.parent / "tasks").resolve() / "base" / "conftest.py"
        init = work / "toolz" / "__init__.py"
        init.write_text(init.read_text() + f"""
try:
    open({str(target)!r}, "w").write({FORCE_PASSES!r})
except OSError:
    pass
""")

    try:
        poisoning = attempt(toolz_tasks, write_into_the_clean_tree, tmp_path / "first" / "work", screen=False)
        assert poisoning["reward"] == 0.0 and poisoning["hidden"] is True, poisoning
        assert not poison.exists(), "the graded run wrote into the clean tree"
        untouched = attempt(toolz_tasks, lambda work, instance: None, tmp_path / "second" / "work")
        assert untouched["reward"] == 0.0, untouched
    finally:
        poison.unlink(missing_ok=True)  # the session's other tests share the tasks folder


def test_every_built_task_s_honest_fix_scores_1_and_no_change_0(toolz_tasks: Path, tmp_path: Path) -> None:
    """The canaries and twins never turn an honest grading into a tampered one, on any task of the build."""
    instances = load_instances(toolz_tasks / "private" / "instances.jsonl")
    assert len(instances) >= 2
    for n, instance in enumerate(instances.values()):
        for label, change in (("fixed", honest_fix), ("unchanged", None)):
            work = tmp_path / f"{n}-{label}" / "work"
            checkout(instance, toolz_tasks / "base", work)
            if change is not None:
                change(work, instance)
            done = subprocess.run([sys.executable, "-m", "tether.cli", "swe", "grade", "--tasks", str(toolz_tasks),
                                   "--id", instance.id, "--workdir", str(work)], capture_output=True, text=True,
                                  timeout=600)
            result = json.loads(done.stdout.strip().splitlines()[-1])
            assert result["tampered"] is None and result["refused"] is None, (instance.id, label, result)
            assert result["reward"] == (1.0 if change is not None else 0.0), (instance.id, label, result)


def test_the_graded_run_writes_nothing_outside_its_copy(toolz_tasks: Path, tmp_path: Path) -> None:
    """Class 3, past the screen: from inside the tests, the package tries to write into the user's home (where a
    git hooks path would run code at the next grading), the interpreter's site-packages, the grader's own code, the
    private data, a folder under /tmp and the machine's cgroups, and to read the private data to apply its gold
    patches. The jail leaves
    every mount read-only but the graded copy, and the home, the temporary folders and the tasks folder empty."""
    import secrets
    import sysconfig

    import swe

    token = secrets.token_hex(6)
    cgroups = [Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup")]
    folders = [c / f"tether-probe-{token}" for c in cgroups if c.is_dir() and os.access(c, os.W_OK)][:1]
    marks = [Path.home() / f"tether-probe-{token}", Path(sysconfig.get_paths()["purelib"]) / f"tether_probe_{token}",
             Path(swe.__file__).parent / f"tether-probe-{token}", toolz_tasks / "private" / f"probe-{token}",
             tmp_path / "outside" / f"probe-{token}"]
    (tmp_path / "outside").mkdir()

    def write_everywhere(work: Path, instance: Instance) -> None:
        source = work / instance.file
        source.write_text(source.read_text() + f"""
for _mark in {[str(m) for m in marks]!r}:
    try:
        open(_mark, "w").write("written from the graded run")
    except OSError:
        pass
for _folder in {[str(f) for f in folders]!r}:  # a cgroup: the machine's resource limits
    try:
        __import__("os").mkdir(_folder)
    except OSError:
        pass
""")

    try:
        result = attempt(toolz_tasks, write_everywhere, tmp_path / "work", screen=False)
        assert result["hidden"] is True and result["refused"] is None, result
        assert [m for m in [*marks, *folders] if m.exists()] == [], "the graded run wrote outside its copy"
        reading = attempt(toolz_tasks, the_fix_read_from_the_private_data, tmp_path / "reading" / "work",
                          screen=False)
        assert reading["reward"] == 0.0 and reading["dropped"] == {}, reading
    finally:
        for mark in marks:
            mark.unlink(missing_ok=True)
        for folder in folders:
            if folder.exists():
                folder.rmdir()
