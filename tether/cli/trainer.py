"""`tether trainer`: the training loop, and the verl settings a run gets."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tether.cli.support import config_or_exit, load_settings, run_with_bar

if TYPE_CHECKING:
    from trainer.checkpoint import TrainerState

trainer_app = typer.Typer(help="The trainer: task groups in, weight versions out.", no_args_is_help=True)


@trainer_app.command("run")
def trainer_run(
    config: Annotated[Path, typer.Argument(help="The trainer's YAML file (run_id, model, batch_groups, lr...).")],
) -> None:
    """Train on the run's task groups as they arrive; pause, update and resume the gateways each B groups."""
    from schemas.settings import BusSettings
    from trainer.config import load_config as load_trainer_config
    from trainer.errors import TrainerError
    from trainer.loop import Trainer
    from trainer.report import plot_history

    bus = load_settings(BusSettings)
    cfg = config_or_exit(load_trainer_config, config, TrainerError)

    def main(update: Callable[..., None]) -> Coroutine[Any, Any, TrainerState]:
        def tick(m: dict[str, float]) -> None:
            update(advance=1, detail=f"v{m['version']:.0f} reward {m['mean_reward']:.3f} "
                                     f"loss {m['loss']:.4f} ({m['task_groups']:.0f} groups)")

        return Trainer(cfg, bus, on_update=tick).run()

    state = run_with_bar(f"updates of {cfg.run_id}", cfg.max_updates, "waiting for task groups", TrainerError, main,
                         beat="trainer")
    if state.history:
        out = plot_history(state.history, cfg.run_dir / "updates.png", f"run {cfg.run_id}")
        typer.echo(f"{len(state.history)} updates, now version {state.version}; plot: {out}", err=True)


@trainer_app.command("verl-config")
def trainer_verl_config(
    config: Annotated[Path, typer.Argument(help="The trainer's YAML file.")],
    gpu: Annotated[bool, typer.Option(help="As on GPUs (bfloat16, flash attention); default: as this machine.")]
    = False,
) -> None:
    """The `actor_rollout_ref` config verl's workers get with `backend: verl`: verl's own defaults, this run's
    settings merged in (YAML on stdout)."""
    import torch
    from omegaconf import OmegaConf

    from trainer.config import load_config as load_trainer_config
    from trainer.errors import TrainerError
    from trainer.verl.workers import actor_config

    cfg = config_or_exit(load_trainer_config, config, TrainerError)
    cpu = not (gpu or torch.cuda.is_available())
    typer.echo(OmegaConf.to_yaml(actor_config(cfg, cfg.workers, cpu=cpu), resolve=False))
