"""Wiring of one controller process: runner, producer, gateway admin, the loop, and signals that stop it cleanly."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from controller import harness_env
from controller.config import Harness, RunConfig, Sandbox, keep_config, load_tasks
from controller.controller import Controller, Fill, SpecOf
from controller.errors import ConfigError
from controller.gateway_admin import GatewayAdmin
from controller.plan import Launch, RunState
from controller.runners.base import JobSpec, ProcessSpec, Runner, Spec
from controller.runners.local import LocalRunner
from controller.settings import ControllerSettings
from infra.sandbox import cgroups
from infra.sandbox.errors import SandboxError
from infra.sandbox.policy import Policy, gateway_of, inside_url
from schemas.producer import EventProducer
from schemas.rollout_token import DEVELOPMENT_ADMIN_KEY, DEVELOPMENT_SECRET


def _shared(spec: Spec, **changes: Any) -> dict[str, Any]:
    """The fields every spec has, as keywords for the kind's own record."""
    return {**{f.name: getattr(spec, f.name) for f in dataclasses.fields(Spec)}, **changes}


log = logging.getLogger("tether.controller")


def process_specs(harness: Harness, sandbox: Sandbox | None = None, gateway_url: str = "",
                  hidden: tuple[Path, ...] = ()) -> SpecOf[ProcessSpec]:
    """Local runs: the harness's command in its workdir, the rollout's environment over what it may have of the
    controller's (`harness_env`); with `sandbox` enabled, the command run by the sandbox's launcher
    (`python -m infra.sandbox POLICY -- COMMAND`), which reaches the gateway at `gateway_url` for it, with
    `hidden` (the run's logs) out of its sight wherever they lie."""
    command = harness.command or []
    here = (harness.workdir or Path.cwd()).absolute()

    def path(p: str, fill_in: Fill) -> str:
        return os.path.normpath(here / str(fill_in(p)))

    def make(base: Spec, fill_in: Fill) -> ProcessSpec:
        argv: list[str] = fill_in(command)
        setup = fill_in(harness.setup) if harness.setup else None
        if sandbox is None or not sandbox.enabled:
            return ProcessSpec(**_shared(base, env={**harness_env.unsandboxed(os.environ), **base.env}), argv=argv,
                               workdir=harness.workdir, setup=setup)
        policy = Policy(workdir=path(sandbox.workdir, fill_in) if sandbox.workdir else str(here),
                        read_only=[path(p, fill_in) for p in sandbox.read_only],
                        writable=[path(p, fill_in) for p in sandbox.writable],
                        hide=[*(path(p, fill_in) for p in sandbox.hide), *(str(h.absolute()) for h in hidden)],
                        gateway=gateway_url, limits=sandbox.limits, **({"uid": sandbox.uid} if sandbox.uid else {}))
        inside = inside_url(gateway_url)  # a privileged port is served inside at another
        own = {k: inside + v[len(gateway_url):] if v.startswith(gateway_url) else v for k, v in base.env.items()}
        env = {**harness_env.sandboxed(os.environ, sandbox.pass_env), **own}
        return ProcessSpec(**_shared(base, env=env), workdir=harness.workdir, setup=setup,
                           argv=[sys.executable, "-m", "infra.sandbox", policy.model_dump_json(), "--", *argv])

    return make


def announce_sandbox(config: RunConfig, settings: ControllerSettings) -> None:
    """Say at the start how the run's harnesses are confined; refuse a sandbox that cannot be made here."""
    gateway_url = settings.harness_url
    if config.runner != "local":
        return
    if not config.sandbox.enabled:
        log.warning("sandbox: off (sandbox.enabled is false in the run file): each harness runs as this user, "
                    "with this machine's files, processes and network")
        return
    import shutil

    if shutil.which("bwrap") is None:
        raise ConfigError("sandbox: bubblewrap is not installed (Debian: apt-get install bubblewrap); or set "
                          "`sandbox: false` in the run file to run harnesses unconfined")
    try:
        gateway_of(gateway_url)
    except SandboxError as exc:
        raise ConfigError(str(exc)) from exc
    limits = config.sandbox.limits
    group, how = cgroups.make(f"tether-probe-{os.getpid()}", limits.memory_mb, limits.processes, limits.cpus)
    if group is not None:
        group.remove()
    elif limits.cgroup:  # every rollout would be refused: say it once, now
        raise ConfigError(f"sandbox: {how}; set sandbox.limits.cgroup: false to run without one")
    else:
        log.warning("sandbox: %s (sandbox.limits.cgroup is false)", how)
    if DEVELOPMENT_SECRET in (settings.gateway_secret, settings.gateway_admin_key) or \
            DEVELOPMENT_ADMIN_KEY in (settings.gateway_secret, settings.gateway_admin_key):
        log.warning("sandbox: the gateway's development secret or admin key is in use; both are public (Tether's "
                    "source), and the sandbox lets the agent reach the gateway: it could mint any rollout's token. "
                    "Set TETHER_GATEWAY_SECRET and TETHER_GATEWAY_ADMIN_KEY (and the controller's) to your own")
    log.info("sandbox: on (bubblewrap): the working copy writable, the gateway the only address, at most "
             "%d MB of memory, %d processes, %d MB in the working copy", limits.memory_mb, limits.processes,
             limits.disk_mb)


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


def make_runner(config: RunConfig, gateway_url: str = "") -> tuple[Runner[Any], SpecOf[Any]]:
    """The run's runner, with the maker of the one kind of spec it runs (the annotations check that they match).
    `gateway_url`: how harnesses reach the gateway (a sandbox lets them reach that and nothing else)."""
    if config.runner == "local":
        local: tuple[Runner[ProcessSpec], SpecOf[ProcessSpec]] = (
            LocalRunner(grace_s=config.grace_s, preload=config.harness.preload),
            process_specs(config.harness, config.sandbox, gateway_url, (config.log_dir,)))
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
    announce_sandbox(config, settings)
    runner, spec_of = make_runner(config, settings.harness_url)
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
