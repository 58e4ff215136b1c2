"""bench/ablation.py end to end at the smallest size: two arms split over two runs, then merged into one table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent
SMALL = ["--seeds", "1", "--updates", "2", "--validate-every", "1", "--batch-groups", "2", "--group-size", "2",
         "--held-out", "3", "--max-turns", "2"]


def ablation(*args: str) -> str:
    done = subprocess.run([sys.executable, "bench/ablation.py", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_split_runs_merge_into_one_table_and_plot(tiny_model: Path, tmp_path: Path) -> None:
    ablation(*SMALL, "--warm", str(tiny_model), "--arms", "sample/token-mean", "--out", str(tmp_path / "a"))
    ablation(*SMALL, "--warm", str(tiny_model), "--arms", "rollout/per-task", "--out", str(tmp_path / "b"),
             "--first-seed", "1")
    curves = json.loads((tmp_path / "b" / "curves.json").read_text())
    assert [(c["arm"], c["seed"]) for c in curves] == [("rollout/per-task", 1)]
    assert [v for v, _ in curves[0]["validation"]] == [0, 1, 2]  # the first version, each one, the last
    assert len(curves[0]["entropy"]) == len(curves[0]["reward"]) == 2
    table = ablation("--merge", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "merged"))
    assert "sample/token-mean" in table and "rollout/per-task (seed system's)" in table
    assert "sample/per-task" not in table  # no runs, no row
    assert (tmp_path / "merged" / "ablation.png").stat().st_size > 10_000
    figures = json.loads((tmp_path / "merged" / "summary.json").read_text())["figures"]
    assert set(figures) == {"sample/token-mean", "rollout/per-task"}
