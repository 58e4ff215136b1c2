"""`tether swe isolate`: what a rollout's agent cannot see. The tasks folder (the clean tree, the grading data)
and, with --alone, the other rollouts' working copies are behind empty mounts that root in the agent's namespace
cannot take away; the agent's own work lands in its real folder."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from swe.isolate import unshare

pytestmark = pytest.mark.skipif(unshare() is None, reason="no user and mount namespaces can be made here "
                                                          "(unshare -rm): isolate runs the agent unhidden")

AGENT = ("echo mine > f; echo tasks: $(ls ../../tasks); echo work: $(ls ..); "
         "umount ../../tasks 2>/dev/null; umount .. 2>/dev/null; "
         "echo after: $(ls ../../tasks) / $(ls ..); cat ../other/answer 2>/dev/null || echo unreadable")


def run_agent(tmp_path: Path, *flags: str) -> list[str]:
    (tmp_path / "tasks" / "base").mkdir(parents=True)
    (tmp_path / "tasks" / "private.jsonl").write_text("the gold patch\n")
    (tmp_path / "work" / "mine").mkdir(parents=True)
    (tmp_path / "work" / "other").mkdir()
    (tmp_path / "work" / "other" / "answer").write_text("a peer's fix\n")
    done = subprocess.run([sys.executable, "-m", "tether.cli", "swe", "isolate", "--hide", "../../tasks", *flags,
                           "--", "sh", "-c", AGENT], cwd=tmp_path / "work" / "mine", capture_output=True, text=True,
                          timeout=60, check=True)
    assert (tmp_path / "work" / "mine" / "f").read_text() == "mine\n"  # its own work is real
    return done.stdout.splitlines()


def test_the_tasks_folder_is_empty_and_stays_so(tmp_path: Path) -> None:
    lines = run_agent(tmp_path)
    assert lines[0] == "tasks:" and lines[2].startswith("after: /")
    assert lines[1] == "work: mine other" and lines[3] == "a peer's fix"  # without --alone, peers are visible


def test_alone_hides_the_other_rollouts_copies(tmp_path: Path) -> None:
    assert run_agent(tmp_path, "--alone") == ["tasks:", "work: mine", "after: / mine", "unreadable"]
    assert (tmp_path / "work" / "other" / "answer").exists()  # hidden from the agent, not gone
