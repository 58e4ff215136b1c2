"""Long work in a log: plain lines when the count moves, and a heartbeat while it does not."""

from __future__ import annotations

import io

from rich.console import Console

from tether.progress import Shown, status


def test_a_log_gets_a_line_per_step_at_most_every_few_seconds_and_one_while_nothing_moves() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    now = [0.0]
    with Shown(console, "RL updates", 4, every_s=30.0, gap_s=5.0, clock=lambda: now[0]) as bar:
        for t, done, detail in [(1, 0, "agents running..."), (10, 0, "agents running..."), (40, 0, "still"),
                                (50, 1, "v1 reward 0.250"), (51, 1, "v1 reward 0.250"), (52, 2, "v2 (too soon)"),
                                (60, 3, "v3 reward 0.5"), (61, 4, "v4 (the last)")]:
            now[0] = t
            bar.update(done, detail)
    assert out.getvalue().splitlines() == [
        "RL updates: 0/4 agents running... (1 s)", "RL updates: 0/4 still (40 s)",
        "RL updates: 1/4 v1 reward 0.250 (50 s)", "RL updates: 3/4 v3 reward 0.5 (60 s)",
        "RL updates: 4/4 v4 (the last) (61 s)"]


def test_a_terminal_gets_a_bar_and_no_lines_per_step() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100)
    with Shown(console, "RL updates", 2) as bar:
        bar.update(1, "v1")
    assert "RL updates: 1/2" not in out.getvalue() and "1/2" in out.getvalue()


def test_a_status_in_a_log_is_one_line() -> None:
    out = io.StringIO()
    with status(Console(file=out, force_terminal=False), "tether up..."):
        pass
    assert out.getvalue() == "tether up...\n"


def test_rollouts_ls_keeps_ids_whole_in_a_narrow_terminal() -> None:
    from controller.plan import RunState
    from schemas.events import RolloutFinished, RolloutStarted
    from tether.cli.bus import rollouts_table

    view = RunState(run_id="demo-20261202-101500", group_size=2, max_attempts=1)
    ids = []
    for i in range(3):
        rid = f"demo-20261202-101500.letters-task-{i:04d}/0.r{i}.a0"
        ids.append(rid)
        view.apply(RolloutStarted(rollout_id=rid, run_id=view.run_id, group_id=f"g{i}",
                                  task_id=f"letters-task-{i:04d}", task_json="{}", group_size=2))
        view.apply(RolloutFinished(rollout_id=rid, run_id=view.run_id, status="failed", exit_code=1, reward=None,
                                   reason="the harness exited with code 1 after a long explanation " * 2,
                                   duration_s=3.5))
    out = io.StringIO()
    Console(file=out, width=80, force_terminal=False).print(rollouts_table(view, view.run_id))
    text = out.getvalue()
    assert all(rid in text for rid in ids), text
    assert all(f"letters-task-{i:04d}" in text for i in range(3))
