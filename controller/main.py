"""Wiring of one controller process: runner, producer, gateway admin, the loop, and signals that stop it cleanly."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
from collections.abc import Callable
from typing import Any

import yaml

from controller.config import Harness, RunConfig, keep_config, load_tasks
from controller.controller import Controller, Fill, SpecOf
from controller.errors import ConfigError
from controller.gateway_admin import GatewayAdmin
from controller.plan import Launch, RunState
from controller.runners.base import JobSpec, ProcessSpec, Runner, Spec
from controller.runners.local import LocalRunner
from controller.settings import ControllerSettings
from schemas.producer import EventProducer


def _shared(spec: Spec, **changes: Any) -> dict[str, Any]:
    """The fields every spec has, as keywords for the kind's own record."""
    return {**{f.name: getattr(spec, f.name) for f in dataclasses.fields(Spec)}, **changes}


def process_specs(harness: Harness) -> SpecOf[ProcessSpec]:
    """Local runs: the harness's command in its workdir, the run's environment over the controller's."""
    command = harness.command or []

    def make(base: Spec, fill_in: Fill) -> ProcessSpec:
        return ProcessSpec(**_shared(base, env={**os.environ, **base.env}), argv=fill_in(command),
                           workdir=harness.workdir)

    return make


def job_specs(template: dict[str, Any]) -> SpecOf[JobSpec]:
    """Kubernetes runs: the run's Job template, filled per rollout."""

    def make(base: Spec, fill_in: Fill) -> JobSpec:
        return JobSpec(**_shared(base), job=fill_in(template))

    return make


def job_template(config: RunConfig) -> dict[str, Any]:
    assert config.harness.job_template is not None  # the config's validator requires it
    try:
        template = yaml.safe_load(config.harness.job_template.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"harness.job_template {config.harness.job_template}: {exc}") from exc
    if not isinstance(template, dict) or template.get("kind") != "Job":
        raise ConfigError(f"harness.job_template {config.harness.job_template}: not a batch/v1 Job manifest")
    return template


def make_runner(config: RunConfig) -> tuple[Runner[Any], SpecOf[Any]]:
    """The run's runner, with the maker of the one kind of spec it runs (the annotations check that they match)."""
    if config.runner == "local":
        local: tuple[Runner[ProcessSpec], SpecOf[ProcessSpec]] = (
            LocalRunner(grace_s=config.grace_s, preload=config.harness.preload), process_specs(config.harness))
        return local
    from controller.runners.kubernetes import KubernetesRunner

    template = job_template(config)
    jobs: tuple[Runner[JobSpec], SpecOf[JobSpec]] = (
        KubernetesRunner(config.kubernetes, config.run_id, config.timeout_s, config.grace_s), job_specs(template))
    return jobs


async def run(config: RunConfig, settings: ControllerSettings,
              on_tick: Callable[[Controller[Any]], None] | None = None, fixed: list[Launch] | None = None) -> RunState:
    """Run until every task group is done (or `fixed`'s launches are), or until SIGINT/SIGTERM (then running
    rollouts are cancelled)."""
    tasks = load_tasks(config.dataset)
    held_out = load_tasks(config.validation.dataset) if config.validation is not None else []
    keep_config(config)
    runner, spec_of = make_runner(config)
    admin = GatewayAdmin(settings.gateway_url, settings.gateway_admin_key)
    async with EventProducer(settings.bus, client_id=f"controller-{config.run_id}") as producer:
        controller: Controller[Any] = Controller(config, settings, tasks, runner=runner, spec_of=spec_of,
                                                 producer=producer, admin=admin, held_out=held_out, fixed=fixed)
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


async def _tick(controller: Controller[Any], on_tick: Callable[[Controller[Any]], None]) -> None:
    while True:
        on_tick(controller)
        await asyncio.sleep(0.25)
