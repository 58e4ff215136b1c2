"""The controller's loop: rebuild the run from tether.rollouts, re-attach or close what was running, launch the rest.

Order per rollout: register it at the gateway, publish `RolloutStarted`
(acknowledged), start the harness. A crash between any two steps leaves a
started rollout with no harness, which the next start finishes as `lost` and
tops up with a new attempt; nothing is launched twice because ids are
deterministic and a started id is never planned again.

With `validation` in the run file, a version that is due (`controller.validation`)
gets a round: ValidationStarted, its rollouts (before any training rollout),
then ValidationReported once they are done. Rounds are rebuilt from
tether.control like everything else, so a restarted controller finishes the
round it was running.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

from controller.config import RunConfig
from controller.errors import ConfigError, GatewayUnavailable, LaunchError, RewardError
from controller.gateway_admin import GatewayAdmin
from controller.placeholders import fill, fill_all
from controller.plan import Launch, RolloutState, RunState
from controller.rewards import parse_reward
from controller.runners.base import Exit, Runner, Spec
from controller.settings import ControllerSettings
from controller.validation import settings_of
from schemas import topics
from schemas.consumer import CaughtUp, EventConsumer
from schemas.events import (
    Event,
    RewardReported,
    RolloutFinished,
    RolloutStarted,
    ValidationReported,
    ValidationStarted,
)
from schemas.producer import EventProducer
from schemas.rollout_token import mint
from schemas.seeds import rollout_seed

log = logging.getLogger("tether.controller")

S = TypeVar("S", bound=Spec)
Fill = Callable[[Any], Any]
"""One rollout's placeholders filled into a string, or into every string inside lists and mappings."""
SpecOf = Callable[[Spec, Fill], S]
"""The spec a runner can run, from what every run has and the rollout's placeholders (see controller.main)."""


class Controller(Generic[S]):
    """One run's rollouts, launched by `runner` from specs that `spec_of` makes for it."""

    def __init__(self, config: RunConfig, settings: ControllerSettings, tasks: list[dict[str, Any]], *,
                 runner: Runner[S], spec_of: SpecOf[S], producer: EventProducer, admin: GatewayAdmin,
                 held_out: list[dict[str, Any]] | None = None, fixed: list[Launch] | None = None) -> None:
        """`fixed`: exactly these launches, in order, instead of the run file's tasks (`tether repro`)."""
        self.config, self.settings, self.tasks = config, settings, tasks
        self.fixed = list(fixed) if fixed is not None else None
        self.held_out = held_out or []  # the validation tasks (`config.validation`)
        self.val_settings = settings_of(config.validation.temperatures) if config.validation else []
        self.runner, self.spec_of, self.producer, self.admin = runner, spec_of, producer, admin
        self.state = RunState(config.run_id, config.group_size, config.max_attempts)
        self.launched = 0  # by this process
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._specs: dict[str, S] = {}
        self._wake = asyncio.Event()
        self._caught_up = asyncio.Event()
        self._stopping = False
        self._failure: BaseException | None = None

    # -- the run -------------------------------------------------------------------

    async def run(self) -> RunState:
        follower = asyncio.create_task(self._follow())
        try:
            await asyncio.wait([follower, asyncio.create_task(self._caught_up.wait())],
                               return_when=asyncio.FIRST_COMPLETED)
            if follower.done():
                follower.result()
            await self._recover()
            while not self._stopping:
                await self._start_round()
                while len(self._tasks) < self.config.concurrency and not self._stopping:
                    launch = self._next_launch()
                    if launch is None:
                        break
                    await self._launch(launch)
                await self._report_round()
                if not self._tasks and self._finished():
                    break  # every group has its K rollouts, or the trainer is done, and the last round is in
                self._wake.clear()
                await self._wake.wait()
            if self._tasks:
                await asyncio.gather(*self._tasks.values(), return_exceptions=True)
            if self._failure is not None:
                raise self._failure
            return self.state
        finally:
            follower.cancel()
            await asyncio.gather(follower, return_exceptions=True)

    def _next_launch(self) -> Launch | None:
        """A validation rollout of the open round first, then training, unless the trainer is done."""
        if self.fixed is not None:
            while self.fixed and self.fixed[0].rollout_id in self.state.rollouts:
                self.fixed.pop(0)  # started before a restart
            return self.fixed.pop(0) if self.fixed else None
        found = self.state.open_round()
        if found is not None and self.config.validation is not None:
            launch = self.state.next_validation_launch(found.version, self.held_out, self.val_settings,
                                                       self.config.validation.samples)
            if launch is not None:
                return launch
        if self.state.final is not None:
            return None  # nothing launched now could be trained on
        return self.state.next_launch(self.tasks, self.config.max_groups_in_flight, self.config.sync_batch)

    def _finished(self) -> bool:
        if self.fixed is not None:
            return not self.fixed
        if self.state.open_round() is not None or self._round_due():
            return False
        return self.state.done(self.tasks)

    def _round_due(self) -> bool:
        validation = self.config.validation
        return validation is not None and self.state.round_due(validation.every)

    async def _start_round(self) -> None:
        if not self._round_due() or self.state.open_round() is not None:
            return
        assert self.config.validation is not None
        n = len(self.held_out) * len(self.val_settings) * self.config.validation.samples
        started = ValidationStarted(run_id=self.config.run_id, version=self.state.version, rollouts=n)
        await self.producer.publish(started)
        self._apply(started)
        log.info("validation of version %d: %d rollouts (%s)", started.version, n,
                 ", ".join(s.name for s in self.val_settings))

    async def _report_round(self) -> None:
        found = self.state.open_round()
        if found is None or found.started is None or self.config.validation is None:
            return
        scores = self.state.round_scores(found.version, self.held_out, self.val_settings,
                                         self.config.validation.samples)
        if scores is None:
            return
        if self.state.requested > found.version:
            log.warning("validation of version %d: the trainer requested version %d before the round was in; some "
                        "of its calls may have been served by it", found.version, self.state.requested)
        seconds = (datetime.now(UTC) - found.started.started_at).total_seconds()
        reported = ValidationReported(run_id=self.config.run_id, version=found.version, scores=scores,
                                      seconds=max(0.0, seconds))
        await self.producer.publish(reported)
        self._apply(reported)
        log.info("validation of version %d in %.0f s: %s", found.version, seconds,
                 ", ".join(f"{s.setting} {s.mean_reward:.3f} over {s.rollouts}" for s in scores))

    async def stop(self) -> None:
        """Launch nothing more and cancel what runs; those rollouts end `cancelled` and are topped up next time."""
        self._stopping = True
        self._wake.set()
        await asyncio.gather(*(self.runner.cancel(self._specs[r]) for r in list(self._tasks)),
                             return_exceptions=True)

    def _apply(self, event: Event) -> None:
        self.state.apply(event)
        self._wake.set()

    async def _follow(self) -> None:
        """Read the run's history, then keep reading: rewards posted by harnesses, and the trainer's weight
        versions (for synchronous mode and the record), arrive here."""
        async with EventConsumer(self.settings.bus, [topics.ROLLOUTS, topics.CONTROL], self.producer,
                                 name=f"controller-{self.config.run_id}") as consumer:
            async for item in consumer.follow(timeout_ms=100):
                if isinstance(item, CaughtUp):
                    self._caught_up.set()
                else:
                    self._apply(item.event)

    async def _recover(self) -> None:
        for state in self.state.running():
            spec = self._spec(self._launch_of(state))
            if await self.runner.attach(spec):
                log.info("re-attached to %s", spec.rollout_id)
                self._watch(spec, state.started.started_at)
            else:
                await self._finish(spec, Exit("lost", None, "its harness was not running when the controller "
                                                             "restarted"), state.started.started_at)

    # -- one rollout ---------------------------------------------------------------

    def _launch_of(self, state: RolloutState) -> Launch:
        s = state.started
        return Launch(s.rollout_id, s.group_id, json.loads(s.task_json), state.slot, s.attempt, s.retry_of,
                      validation=s.validation, temperature=s.temperature, group_size=s.group_size, seed=s.seed)

    def _base(self, launch: Launch, env: dict[str, str]) -> Spec:
        rid = launch.rollout_id
        return Spec(rollout_id=rid, run_id=self.config.run_id, task_id=launch.task_id, attempt=launch.attempt,
                    env=env, log_path=self.config.run_dir / f"{rid}.log")

    def _spec(self, launch: Launch) -> S:
        """The rollout's spec, for the runner; raises ConfigError naming a placeholder the task lacks."""
        rid, url = launch.rollout_id, self.settings.harness_url
        seed = self._seed(launch)
        token = mint(rid, self.settings.gateway_secret, temperature=launch.temperature, seed=seed)
        values = {"rollout_id": rid, "run_id": self.config.run_id, "task_id": launch.task_id,
                  "group_id": launch.group_id, "attempt": launch.attempt}
        env = {k: fill(v, values, launch.task) for k, v in self.config.harness.env.items()}
        env.update(OPENAI_BASE_URL=f"{url}/v1", OPENAI_API_KEY=token, ANTHROPIC_BASE_URL=url,
                   ANTHROPIC_API_KEY=token, TETHER_ROLLOUT_ID=rid, TETHER_RUN_ID=self.config.run_id,
                   TETHER_TASK=json.dumps(launch.task), TETHER_REWARD_URL=f"{url}/rollouts/{rid}/reward",
                   TETHER_SEED=str(seed))
        spec = self.spec_of(self._base(launch, env), lambda obj: fill_all(obj, values, launch.task))
        self._specs[rid] = spec
        return spec

    def _seed(self, launch: Launch) -> int:
        """The rollout's seed: the run's, the task's and its index in the group (every attempt of a slot the same,
        so a retried rollout samples as the one it replaces would have), unless the launch carries one."""
        if launch.seed is not None:
            return launch.seed
        return rollout_seed(self.config.seed, launch.task_id, launch.slot, launch.validation)

    async def _launch(self, launch: Launch) -> None:
        launch = replace(launch, seed=self._seed(launch))  # drawn once: the token, TETHER_SEED and the record
        try:
            spec = self._spec(launch)
        except ConfigError as exc:  # e.g. a placeholder the task lacks: this rollout cannot run
            started = await self._started(launch)
            await self._finish(self._base(launch, {}), Exit("exited", None, str(exc)), started.started_at,
                               failed=True)
            return
        await self.admin.register(launch.rollout_id, self.config.run_id)
        if not launch.validation and self.state.final is not None:
            # The trainer's last version arrived while the gateway registered it: nothing it produced would be
            # trained on, so it never starts. No RolloutStarted, and no seal (one would sit unjoined on the log);
            # the gateway holds an empty registration until it restarts.
            log.info("%s not started: the trainer published its final version", launch.rollout_id)
            return
        started = await self._started(launch)
        try:
            await self.runner.start(spec)
        except LaunchError as exc:
            log.warning("%s could not start: %s", launch.rollout_id, exc)
            await self._finish(spec, Exit("lost", None, f"could not start: {exc}"), started.started_at)
            return
        self.launched += 1
        self._watch(spec, started.started_at)

    async def _started(self, launch: Launch) -> RolloutStarted:
        started = RolloutStarted(
            rollout_id=launch.rollout_id, run_id=self.config.run_id, group_id=launch.group_id,
            task_id=launch.task_id, task_json=json.dumps(launch.task),
            group_size=launch.group_size or self.config.group_size, runner=self.config.runner,
            attempt=launch.attempt, retry_of=launch.retry_of, weight_version=self.state.version,
            validation=launch.validation, temperature=launch.temperature, seed=self._seed(launch))
        await self.producer.publish(started)
        self._apply(started)
        return started

    def _watch(self, spec: S, started_at: datetime) -> None:
        task = asyncio.create_task(self._supervise(spec, started_at))
        self._tasks[spec.rollout_id] = task

        def done(t: asyncio.Task[None]) -> None:
            self._tasks.pop(spec.rollout_id, None)
            if not t.cancelled() and t.exception() is not None and self._failure is None:
                self._failure = t.exception()  # e.g. Kafka refused RolloutFinished: stop, the restart recovers
                self._stopping = True
            self._wake.set()

        task.add_done_callback(done)

    async def _supervise(self, spec: S, started_at: datetime) -> None:
        elapsed = (datetime.now(UTC) - started_at).total_seconds()
        outcome = await self.runner.wait(spec, self.config.timeout_s - elapsed)
        await self._finish(spec, outcome, started_at)

    async def _finish(self, spec: Spec, outcome: Exit, started_at: datetime, failed: bool = False) -> None:
        try:
            await self.admin.seal(spec.rollout_id)
        except GatewayUnavailable as exc:  # the processors then wait for the seal; say so loudly
            log.error("could not seal %s: %s", spec.rollout_id, exc)
        reward, reason = None, outcome.reason
        if failed:
            status = "failed"
        elif outcome.status != "exited":
            status = outcome.status
        elif outcome.exit_code != 0:
            status, reason = "failed", f"the harness exited with code {outcome.exit_code}"
            reward = await self._posted_reward(spec.rollout_id, wait_s=0.0)
        else:
            try:
                reward = await self._reward(spec)
                status = "succeeded"
            except RewardError as exc:
                status, reason = "failed", str(exc)
        finished = RolloutFinished(
            rollout_id=spec.rollout_id, run_id=spec.run_id, status=status, exit_code=outcome.exit_code,
            reward=reward, reason=reason,
            duration_s=max(0.0, (datetime.now(UTC) - started_at).total_seconds()))
        await self.producer.publish(finished)
        self._apply(finished)

    async def _posted_reward(self, rollout_id: str, wait_s: float) -> float | None:
        deadline = time.monotonic() + wait_s
        while True:
            state = self.state.rollouts.get(rollout_id)
            if state is not None and state.reward is not None:
                return state.reward.reward
            if time.monotonic() >= deadline:
                return None
            await asyncio.sleep(0.02)

    async def _reward(self, spec: Spec) -> float:
        source = self.config.reward
        if source.source == "harness":
            reward = await self._posted_reward(spec.rollout_id, source.wait_s)
            if reward is None:
                raise RewardError(f"no reward was posted to TETHER_REWARD_URL within {source.wait_s:.0f} s")
            return reward
        state = self.state.rollouts[spec.rollout_id]
        launch = self._launch_of(state)
        values = {"rollout_id": spec.rollout_id, "run_id": spec.run_id, "task_id": spec.task_id,
                  "group_id": launch.group_id, "attempt": spec.attempt}
        argv = [fill(a, values, launch.task) for a in source.command or []]
        env = {**os.environ, **spec.env, "TETHER_HARNESS_LOG": str(spec.log_path)}
        try:
            process = await asyncio.create_subprocess_exec(
                *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
                cwd=self.config.harness.workdir)
            out, err = await asyncio.wait_for(process.communicate(), self.config.timeout_s)
        except TimeoutError:
            process.kill()
            raise RewardError(f"the reward command ran past {self.config.timeout_s:.0f} s") from None
        except OSError as exc:
            raise RewardError(f"the reward command cannot run: {exc}") from exc
        if process.returncode != 0:
            raise RewardError(f"the reward command exited with {process.returncode}: "
                              f"{err.decode(errors='replace')[-300:]}")
        reward = parse_reward(out.decode(errors="replace"))
        event = RewardReported(rollout_id=spec.rollout_id, run_id=spec.run_id, reward=reward, source="command")
        await self.producer.publish(event)
        self._apply(event)
        return reward
