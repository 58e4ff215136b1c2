"""`tether controller run`: a run's rollouts, K per task, launched and watched to the end."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tether.cli.support import config_or_exit, load_settings, run_with_bar

if TYPE_CHECKING:
    from controller.plan import RunState

controller_app = typer.Typer(help="The rollout controller: runs K harness rollouts per task.", no_args_is_help=True)


@controller_app.command("run")
def controller_run(
    config: Annotated[Path, typer.Argument(help="The run's YAML file (dataset, group size, harness, runner...).")],
) -> None:
    """Launch K rollouts per task until every task group is done; Ctrl-C cancels what runs (resumable)."""
    from controller.config import load_config
    from controller.controller import Controller
    from controller.errors import ControllerError
    from controller.main import run
    from controller.settings import ControllerSettings

    settings = load_settings(ControllerSettings)
    cfg = config_or_exit(load_config, config, ControllerError)

    def main(update: Callable[..., None]) -> Coroutine[Any, Any, RunState]:
        def tick(c: Controller[Any]) -> None:
            training = [s for s in c.state.rollouts.values() if not s.started.validation]
            finished = [s for s in training if s.finished is not None]
            counted = [s for s in finished if s.finished and s.finished.status in ("succeeded", "failed", "timeout")]
            rewards = [s.finished.reward for s in counted if s.finished and s.finished.reward is not None]
            mean = f"mean reward {sum(rewards) / len(rewards):.3f}" if rewards else "no rewards yet"
            rounds = [r.reported for _, r in sorted(c.state.rounds.items()) if r.reported is not None]
            held = (" · held-out v{} {}".format(rounds[-1].version, " ".join(
                f"{s.setting} {s.mean_reward:.3f}" for s in rounds[-1].scores)) if rounds else "")
            update(total=len(c.tasks) * cfg.group_size, completed=len(counted),
                   detail=f"running {len(c.state.running())} · finished {len(finished)} · {mean}{held}")

        return run(cfg, settings, tick)

    state = run_with_bar(f"run {cfg.run_id}", None, "", ControllerError, main, beat="controller")
    done = sum(1 for t in state.slots if state.group_done(t))
    typer.echo(f"run {cfg.run_id}: {done} task groups done; logs in {cfg.run_dir}", err=True)
    for version, found in sorted(state.rounds.items()):
        if found.reported is not None:
            scores = ", ".join(f"{s.setting} {s.mean_reward:.3f} over {s.rollouts}" for s in found.reported.scores)
            typer.echo(f"held-out validation of version {version}: {scores}", err=True)
