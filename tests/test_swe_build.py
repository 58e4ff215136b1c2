"""`tether swe build` on a real package (toolz, its sdist from PyPI: conftest's `toolz_tasks`): bugs its own tests
catch become tasks."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from swe.build import load_instances, source_files
from swe.sources import git
from swe.testrun import run_tests


def test_the_base_is_one_commit_of_the_release_with_no_other_history(toolz_tasks: Path) -> None:
    base = toolz_tasks / "base"
    assert git(base, "rev-list", "--all").count("\n") == 1
    assert git(base, "tag") == "" and git(base, "reflog").count("\n") <= 1
    assert (base / "toolz" / "itertoolz.py").exists() and (base / "toolz" / "tests").is_dir()
    files = source_files(base)
    assert Path("toolz/itertoolz.py") in files
    assert not any("tests" in f.parts or f.name == "setup.py" for f in files)


def test_kept_bugs_fail_their_tests_and_the_gold_patch_fixes_them(toolz_tasks: Path, tmp_path: Path) -> None:
    figures = json.loads((toolz_tasks / "build.json").read_text())
    instances = load_instances(toolz_tasks / "private" / "instances.jsonl")
    assert figures["candidates"] == 8 and figures["kept"] == len(instances) >= 1
    assert figures["kept"] + sum(figures["rejected"].values()) == 8
    assert len({i.bug_patch for i in instances.values()}) == len(instances)  # no duplicate diffs
    instance = next(iter(instances.values()))
    assert instance.fail_to_pass and not set(instance.fail_to_pass) & set(instance.pass_to_pass)
    work = shutil.copytree(toolz_tasks / "base", tmp_path / "work")
    subprocess.run(["git", "apply"], input=instance.bug_patch, text=True, cwd=work, check=True)
    buggy = run_tests(work, timeout_s=300, tests=instance.fail_to_pass)
    assert not any(buggy.outcome(t) for t in instance.fail_to_pass)
    subprocess.run(["git", "apply"], input=instance.gold_patch, text=True, cwd=work, check=True)
    fixed = run_tests(work, timeout_s=300, tests=instance.fail_to_pass)
    assert all(fixed.outcome(t) for t in instance.fail_to_pass)


def test_the_tasks_file_says_what_fails_and_nothing_of_the_fix(toolz_tasks: Path) -> None:
    instances = load_instances(toolz_tasks / "private" / "instances.jsonl")
    tasks = [json.loads(line) for line in (toolz_tasks / "tasks.jsonl").read_text().splitlines()]
    assert [t["id"] for t in tasks] == list(instances)
    for task in tasks:
        assert set(task) == {"id", "problem", "package"}
        instance = instances[task["id"]]
        assert instance.fail_to_pass[0] in task["problem"]
        changed = [line[1:].strip() for line in instance.bug_patch.splitlines()
                   if line[:1] in "+-" and line[:3] not in ("+++", "---") and line[1:].strip()]
        assert not any(c in task["problem"] for c in changed if len(c) > 12)  # the diff is not told


def test_an_unpinned_package_is_refused_naming_the_option() -> None:
    done = subprocess.run([sys.executable, "-m", "tether.cli", "swe", "build", "--package", "toolz"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "--package" in done.stderr and "NAME==VERSION" in done.stderr


def test_a_src_layout_package_is_imported_from_src_and_results_come_from_the_report(tmp_path: Path) -> None:
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    (tmp_path / "src" / "pkg" / "__init__.py").write_text("def double(x):\n    return 2 * x\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_pkg.py").write_text(
        "import pkg\n\ndef test_double():\n    assert pkg.double(2) == 4\n\n"
        "class TestMore:\n    def test_wrong(self):\n        assert pkg.double(1) == 3, 'one doubled'\n")
    report = run_tests(tmp_path, timeout_s=120, tests=["tests/test_pkg.py", "tests/test_pkg.py::test_gone"])
    assert report.passed == {"tests/test_pkg.py::test_double"}
    assert "one doubled" in report.failed["tests/test_pkg.py::TestMore::test_wrong"]
    assert not report.outcome("tests/test_pkg.py::test_gone")  # asked for and never run: failed
