"""Playing a probe: a fresh checkout of a built task, the probe's change, and the grade as a run's reward command
gets it (or, with the screen off, as the layers inside the graded run see it)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from swe.build import Instance, load_instances
from swe.grade import checkout

Probe = Callable[[Path, Instance], None]


def instance_of(tasks: Path) -> Instance:
    return next(iter(load_instances(tasks / "private" / "instances.jsonl").values()))


def failing_test_files(instance: Instance) -> list[str]:
    return sorted({t.split("::")[0] for t in instance.fail_to_pass})


def honest_fix(work: Path, instance: Instance) -> None:
    subprocess.run(["git", "apply", "-"], input=instance.gold_patch, text=True, cwd=work, check=True)



def attempt(tasks: Path, probe: Probe, work: Path, *, screen: bool = True) -> dict[str, object]:
    """`probe` played on a fresh checkout and graded through the CLI as a run's reward command does; with `screen`
    off, graded in this process with the screen (`swe.reach`) taking every file, so that the layers inside the
    graded run (the jail, the canaries, the behaviour check) face the probe alone."""
    instance = instance_of(tasks)
    checkout(instance, tasks / "base", work)
    (work.parent / "tasks").symlink_to(tasks, target_is_directory=True)  # as a run's folder has them
    probe(work, instance)
    if not screen:
        from dataclasses import asdict
        from unittest import mock

        from swe.grade import grade

        with mock.patch("swe.grade.beyond", return_value=[]):
            return asdict(grade(instance, tasks / "base", work, timeout_s=300))
    done = subprocess.run([sys.executable, "-m", "tether.cli", "swe", "grade", "--tasks", str(tasks), "--id",
                           instance.id, "--workdir", str(work), "--timeout-s", "300"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# --- past the screen: probes of the layers inside the graded run (the screen, `swe.reach`, drops them all first)
