"""Wiring of one controller process: runner, producer, gateway admin, the loop, and signals that stop it cleanly."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable
from typing import Any

import yaml

from controller.config import RunConfig, load_tasks
from controller.controller import Controller
from controller.errors import ConfigError
from controller.gateway_admin import GatewayAdmin
from controller.plan import RunView
from controller.runners.base import Runner
from controller.runners.local import LocalRunner
from controller.settings import ControllerSettings
from schemas.producer import EventProducer


def make_runner(config: RunConfig) -> tuple[Runner, dict[str, Any] | None]:
    if config.runner == "local":
        return LocalRunner(grace_s=config.grace_s, preload=config.harness.preload), None
    from controller.runners.kubernetes import KubernetesRunner

    assert config.harness.job_template is not None  # the config's validator requires it
    try:
        template = yaml.safe_load(config.harness.job_template.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"harness.job_template {config.harness.job_template}: {exc}") from exc
    if not isinstance(template, dict) or template.get("kind") != "Job":
        raise ConfigError(f"harness.job_template {config.harness.job_template}: not a batch/v1 Job manifest")
    return KubernetesRunner(config.kubernetes, config.run_id, config.timeout_s, config.grace_s), template


async def run(config: RunConfig, settings: ControllerSettings,
              on_tick: Callable[[Controller], None] | None = None) -> RunView:
    """Run until every task group is done, or until SIGINT/SIGTERM (then running rollouts are cancelled)."""
    tasks = load_tasks(config.dataset)
    config.run_dir.mkdir(parents=True, exist_ok=True)
    runner, template = make_runner(config)
    admin = GatewayAdmin(settings.gateway_url, settings.gateway_admin_key)
    async with EventProducer(settings.bus, client_id=f"controller-{config.run_id}") as producer:
        controller = Controller(config, settings, tasks, runner, producer, admin, template)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, lambda: asyncio.ensure_future(controller.stop()))
        ticker = asyncio.create_task(_tick(controller, on_tick)) if on_tick else None
        try:
            return await controller.run()
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            if ticker is not None:
                ticker.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await ticker
                on_tick(controller)  # type: ignore[misc]  # the final state
            await runner.close()
            await admin.close()


async def _tick(controller: Controller, on_tick: Callable[[Controller], None]) -> None:
    while True:
        on_tick(controller)
        await asyncio.sleep(0.25)
