"""bench/gpu_check.py runs whole on the CPU path, so the script a GPU session runs in one go is known to work."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent


def test_the_gpu_check_runs_on_the_cpu_and_every_hand_over_lands() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--updates", "1",
                           "--prompt-tokens", "200"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "engine holds version 1" in done.stdout
    assert "tensors identical" in done.stdout
    assert "8 hits" in done.stdout  # the second round's 8 requests reused the cached prefix
