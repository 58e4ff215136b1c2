"""A failing test's report carries what the machine said at the time; a passing one carries nothing extra."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_a_failure_reports_the_machine_and_a_pass_does_not(tmp_path: Path) -> None:
    (tmp_path / "test_it.py").write_text("def test_fails():\n    assert False\n\ndef test_passes():\n    pass\n")
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.machine_report", "-p", "no:cacheprovider",
                          "-rA", str(tmp_path / "test_it.py")], capture_output=True, text=True,
                         cwd=Path(__file__).parent.parent, timeout=120)
    assert run.returncode == 1, run.stdout
    assert run.stdout.count("machine at failure") == 1, run.stdout
    section = run.stdout.split("machine at failure", 1)[1]
    assert "memory: " in section and " available of " in section
    assert "PID" in section  # the largest processes, by resident memory
