"""One contract for every update backend the loop can be given (trainer/backend.py): the embedded torch learner,
and verl's own FSDP2 workers on Ray (two CPU processes over gloo here, as on a GPU cluster minus the GPUs)."""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from infra.processes import free_port, stop
from schemas.events import RolloutSample, Segment, TaskGroup, TrainerStep
from tests.conftest import spawn
from tests.factories import T0
from tests.fakes.held_weights import fingerprint, read_folder
from trainer import checkpoint
from trainer.advantages import ScoredGroups
from trainer.backend import UpdateBackend
from trainer.checkpoint import TrainerState
from trainer.config import EngineConfig, TrainerConfig
from trainer.engines.base import buckets
from trainer.engines.fleet import EngineFleet
from trainer.errors import UpdateFailed
from trainer.learner import TorchLearner
from trainer.metrics import UpdateMetrics, UpdateRecord
from trainer.verl.backend import VerlBackend
from trainer.verl.workers import VerlWorkers

PROMPT, GOOD, BAD = [5, 17, 99, 42], [300, 301, 302], [700, 701, 702]


@dataclass(frozen=True)
class Subject:
    """A backend under test, and the policy it holds now (as a model this process can score with)."""
    backend: UpdateBackend
    policy: Callable[[], PreTrainedModel]


Open = Callable[[Path | None], Subject]  # a backend restored from a checkpoint folder, or fresh


def config_for(tiny_model: Path, run_dir: Path | None = None) -> TrainerConfig:
    return TrainerConfig(run_id="run", model=tiny_model, lr=1e-3, device="cpu",
                         checkpoint_dir=run_dir or Path("/nonexistent"))


@pytest.fixture(scope="module")
def verl_workers(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[VerlWorkers, Path]]:
    """verl's workers, two of them, started once; and their checkpoint as started, which a test's fresh backend
    goes back to."""
    workers = VerlWorkers.start(config_for(tiny_model), world_size=2)
    fresh = tmp_path_factory.mktemp("verl") / "fresh"
    workers.save_checkpoint(fresh, 0)
    try:
        yield workers, fresh
    finally:
        workers.close()


def exported(backend: VerlBackend, folder: Path) -> PreTrainedModel:
    backend.workers.export_weights(folder)
    return AutoModelForCausalLM.from_pretrained(folder)


@pytest.fixture(params=["torch", "verl"])
def open_backend(request: pytest.FixtureRequest, tiny_model: Path, tmp_path: Path) -> Open:
    config = config_for(tiny_model, tmp_path / "runs")

    def torch_learner(found: Path | None) -> Subject:
        learner = TorchLearner.load(config, torch.device("cpu"), found)
        return Subject(learner, lambda: learner.model)

    def verl(found: Path | None) -> Subject:
        workers, fresh = request.getfixturevalue("verl_workers")
        backend = VerlBackend.open(config, workers, found)
        if found is None:
            workers.load_checkpoint(fresh)
        folders = iter(range(10**6))
        return Subject(backend, lambda: exported(backend, tmp_path / f"export-{next(folders)}"))

    return torch_learner if request.param == "torch" else verl


def response_log_prob(model: PreTrainedModel, response: list[int]) -> float:
    """log π(response | PROMPT), summed over the response."""
    per_token = token_log_probs(model, PROMPT + response)
    return sum(per_token[len(PROMPT):])


def token_log_probs(model: PreTrainedModel, ids: list[int]) -> list[float]:
    """Each token's log-probability after the ones before it (0 for the first)."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].float()
    picked = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
    return [0.0, *picked.tolist()]


def good_vs_bad(model: PreTrainedModel, version: int = 0) -> list[TaskGroup]:
    """One task: GOOD rewarded, BAD not, both as if the policy had just sampled them (at `version`)."""
    def rollout(response: list[int], reward: float) -> RolloutSample:
        ids = PROMPT + response
        segment = Segment(token_ids=ids, loss_mask=[False] * len(PROMPT) + [True] * len(response),
                          logprobs=token_log_probs(model, ids), weight_versions=[version] * len(ids))
        return RolloutSample(rollout_id=f"x-{reward}", reward=reward, status="succeeded", segments=[segment])

    return [TaskGroup(group_id="x", run_id="run", task_id="x", group_size=2, created_at=T0,
                      rollouts=[rollout(GOOD, 1.0), rollout(BAD, 0.0)])]


def test_an_update_moves_the_policy_toward_the_advantage(open_backend: Open) -> None:
    torch.manual_seed(0)
    subject = open_backend(None)
    policy = subject.policy()
    before_good, before_bad = response_log_prob(policy, GOOD), response_log_prob(policy, BAD)
    for _ in range(5):
        subject.backend.update(ScoredGroups.of(good_vs_bad(policy)), version=0)
        policy = subject.policy()
    assert response_log_prob(policy, GOOD) > before_good + 0.5
    assert response_log_prob(policy, BAD) < before_bad - 0.5


def test_the_metrics_are_the_batchs_and_map_onto_a_trainer_step(open_backend: Open) -> None:
    subject = open_backend(None)
    metrics = subject.backend.update(ScoredGroups.of(good_vs_bad(subject.policy(), version=0)), version=2)
    assert (metrics.tokens, metrics.task_groups, metrics.optimizer_steps) == (6, 1, 1)  # 3 + 3 response tokens
    assert metrics.staleness_mean == metrics.staleness_max == 2.0  # sampled at version 0, trained at 2
    assert math.isfinite(metrics.loss) and metrics.grad_norm > 0 and metrics.seconds > 0
    assert metrics.is_weight_mean == pytest.approx(1.0, abs=1e-3)  # sampled by these very weights

    record = UpdateRecord(version=3, metrics=metrics, mean_reward=0.5, dropped_stale=1, dropped_no_signal=2,
                          time=1.0)
    step = record.event("run")
    assert isinstance(step, TrainerStep)
    assert (step.version, step.task_groups, step.tokens, step.mean_reward) == (3, 1, 6, 0.5)
    assert (step.loss, step.grad_norm, step.staleness_max) == (metrics.loss, metrics.grad_norm, 2.0)
    assert (step.dropped_stale, step.dropped_no_signal, step.seconds) == (1, 2, metrics.seconds)
    row = record.row()  # the history row the checkpoint keeps and the plots read
    assert {k: row[k] for k in ("version", "tokens", "task_groups", "mean_reward", "time")} == {
        "version": 3.0, "tokens": 6.0, "task_groups": 1.0, "mean_reward": 0.5, "time": 1.0}
    assert row["loss"] == metrics.loss and row["seconds"] == metrics.seconds


def test_no_groups_is_no_update(open_backend: Open) -> None:
    subject = open_backend(None)
    before = response_log_prob(subject.policy(), GOOD)
    # zeros: what the loop records for it
    assert subject.backend.update(ScoredGroups.of([]), version=4) == UpdateMetrics()
    assert response_log_prob(subject.policy(), GOOD) == pytest.approx(before, abs=1e-6)


def test_a_committed_checkpoint_restores_the_weights_and_the_optimiser(open_backend: Open, tmp_path: Path) -> None:
    """One backend at a time (verl's workers are one group): train, commit, train on; then restore the commit and
    train on the same batch: the same weights only if the optimiser's state came back with them."""
    first = open_backend(None)
    first.backend.update(ScoredGroups.of(good_vs_bad(first.policy())), version=0)
    state = TrainerState(version=1, offsets={"0": 7}, trained={"x": 1}, history=[{"version": 1.0}])
    staging = first.backend.stage(tmp_path, state)
    assert checkpoint.latest(tmp_path) is None  # staged is not committed
    final = checkpoint.commit(tmp_path, staging, 1)
    assert checkpoint.latest(tmp_path) == final and checkpoint.load_state(final) == state
    on_disk = AutoModelForCausalLM.from_pretrained(final)  # the folder is a model the engines load as it is
    trained_policy = first.policy()
    trained = response_log_prob(trained_policy, GOOD)
    assert response_log_prob(on_disk, GOOD) == pytest.approx(trained, abs=1e-5)
    groups = good_vs_bad(trained_policy)
    first.backend.update(ScoredGroups.of(groups), version=1)
    went_on = first.policy()
    after_good, after_bad = response_log_prob(went_on, GOOD), response_log_prob(went_on, BAD)

    resumed = open_backend(final)
    assert response_log_prob(resumed.policy(), GOOD) == pytest.approx(trained, abs=1e-5)
    resumed.backend.update(ScoredGroups.of(groups), version=1)
    again = resumed.policy()
    assert response_log_prob(again, GOOD) == pytest.approx(after_good, abs=1e-4)
    assert response_log_prob(again, BAD) == pytest.approx(after_bad, abs=1e-4)
    assert response_log_prob(open_backend(None).policy(), GOOD) != pytest.approx(trained, abs=1e-3)


def stale_good_vs_bad(model: PreTrainedModel) -> list[TaskGroup]:
    """As if sampled by older weights, differently for each rollout: importance weights away from 1, a loss
    away from 0."""
    [group] = good_vs_bad(model)
    shifted = [replace(r, segments=[replace(s, logprobs=[lp + (0.3 if r.reward else -0.2) * m for lp, m in
                                                         zip(s.logprobs, s.loss_mask, strict=True)])
                                    for s in r.segments]) for r in group.rollouts]
    return [replace(group, rollouts=shifted)]


def test_both_backends_take_the_same_first_step(tiny_model: Path, tmp_path: Path,
                                                 verl_workers: tuple[VerlWorkers, Path]) -> None:
    """From the same weights on the same batch: the same loss, gradient norm and resulting policy, within
    float32 noise (FSDP2 over two workers against one process; eager attention against sdpa)."""
    config = config_for(tiny_model, tmp_path / "runs")
    learner = TorchLearner.load(config, torch.device("cpu"), None)
    workers, fresh = verl_workers
    workers.load_checkpoint(fresh)
    verl = VerlBackend(config, workers)
    groups = stale_good_vs_bad(learner.model)
    scored = ScoredGroups.of(groups)
    by_torch, by_verl = learner.update(scored, version=0), verl.update(scored, version=0)
    assert abs(by_torch.loss) > 0.05
    assert by_verl.loss == pytest.approx(by_torch.loss, rel=1e-3, abs=1e-5)
    assert by_verl.grad_norm == pytest.approx(by_torch.grad_norm, rel=1e-3)
    assert by_verl.is_weight_mean == pytest.approx(by_torch.is_weight_mean, rel=1e-4)
    after = exported(verl, tmp_path / "verl")
    for response in (GOOD, BAD):
        assert response_log_prob(after, response) == pytest.approx(response_log_prob(learner.model, response),
                                                                   abs=2e-3)


def test_a_worker_killed_mid_update_fails_it_cleanly_and_the_next_succeeds(
        tiny_model: Path, tmp_path: Path, verl_workers: tuple[VerlWorkers, Path]) -> None:
    workers, fresh = verl_workers
    workers.load_checkpoint(fresh)
    backend = VerlBackend(config_for(tiny_model, tmp_path / "runs"), workers)
    policy = exported(backend, tmp_path / "before")
    long = [TaskGroup(group_id=f"g{i}", run_id="run", task_id=f"t{i}", group_size=2, created_at=T0, rollouts=[
        RolloutSample(rollout_id=f"g{i}-{r}", reward=float(r), status="succeeded", segments=[Segment(
            token_ids=PROMPT + [(i * 7 + r + k) % 1000 for k in range(600)], loss_mask=[False] * 4 + [True] * 600,
            logprobs=[0.0] * 604, weight_versions=[0] * 604)]) for r in (0, 1)]) for i in range(16)]
    failed: list[BaseException] = []

    def update() -> None:
        try:
            backend.update(ScoredGroups.of(long), version=0)
        except BaseException as exc:  # the test reads it
            failed.append(exc)

    victim = workers.pids()[1]
    running = threading.Thread(target=update)
    running.start()
    time.sleep(1.0)  # into the update: sixteen 600-token pairs take several seconds on two CPU workers
    assert running.is_alive(), "the update ended before the worker could be killed: make the batch longer"
    os.kill(victim, signal.SIGKILL)
    running.join(300)
    assert len(failed) == 1 and isinstance(failed[0], UpdateFailed), failed
    assert "version 1" in str(failed[0])
    assert victim not in workers.pids()  # new workers, from the starting model (no checkpoint was committed)
    assert response_log_prob(exported(backend, tmp_path / "restarted"), GOOD) == pytest.approx(
        response_log_prob(policy, GOOD), abs=1e-5)
    metrics = backend.update(ScoredGroups.of(good_vs_bad(policy)), version=0)
    assert metrics.optimizer_steps == 1 and metrics.grad_norm > 0
    assert response_log_prob(exported(backend, tmp_path / "after"), GOOD) > response_log_prob(policy, GOOD)


def test_both_backends_reach_the_same_policy_with_two_epochs(tiny_model: Path, tmp_path: Path,
                                                             verl_workers: tuple[VerlWorkers, Path]) -> None:
    """The demo's presets take two passes over each batch (PPO's sample reuse, the second against the policy
    before the first step): both backends end at the same policy, as they do after one."""
    config = config_for(tiny_model, tmp_path / "runs").model_copy(update={"epochs": 2})
    learner = TorchLearner.load(config, torch.device("cpu"), None)
    workers, fresh = verl_workers
    workers.load_checkpoint(fresh)
    verl = VerlBackend(config, workers)
    scored = ScoredGroups.of(stale_good_vs_bad(learner.model))
    before = [response_log_prob(learner.model, r) for r in (GOOD, BAD)]
    learner.update(scored, version=0)
    verl.update(scored, version=0)
    after = exported(verl, tmp_path / "verl")
    for response, was in zip((GOOD, BAD), before, strict=True):
        moved = response_log_prob(learner.model, response) - was
        assert abs(moved) > 1e-3  # two steps moved it
        assert response_log_prob(after, response) == pytest.approx(response_log_prob(learner.model, response),
                                                                   abs=2e-3 + 0.05 * abs(moved))


def test_adam_eps_damps_the_step_on_gradients_near_zero(tiny_model: Path, tmp_path: Path) -> None:
    """Adam scales each coordinate's step to about lr however small its gradient; with `adam_eps` above the
    gradients' size the same batch moves the policy much less."""
    moved = []
    for eps in (1e-8, 1.0):
        config = config_for(tiny_model, tmp_path / f"runs-{eps}").model_copy(update={"adam_eps": eps})
        learner = TorchLearner.load(config, torch.device("cpu"), None)
        assert learner.optimizer.param_groups[0]["eps"] == eps
        scored = ScoredGroups.of(stale_good_vs_bad(learner.model))
        before = response_log_prob(learner.model, GOOD)
        learner.update(scored, version=0)
        moved.append(abs(response_log_prob(learner.model, GOOD) - before))
    assert moved[1] < moved[0] / 10


@pytest.fixture
def sglang_fakes(tiny_model: Path, tmp_path: Path) -> Iterator[list[str]]:
    """Two SGLang replicas (the fake of `tests/fakes/sglang.py`), launched on the tiny model."""
    processes = []
    try:
        for i in range(2):
            port = free_port()
            url, process = spawn(["tests.fakes.sglang", "--model", str(tiny_model), "--port", str(port)],
                                 tmp_path / f"sglang{i}.log", "sglang fake", port)
            processes.append((url, process))
        yield [url for url, _ in processes]
    finally:
        for _, process in processes:
            stop(process)


async def held_by(urls: list[str]) -> list[str]:
    async with httpx.AsyncClient() as client:
        return [(await client.get(f"{url}/fake/state")).json()["fingerprint"] for url in urls]


async def test_the_weight_sender_broadcasts_what_the_backend_trained(
        open_backend: Open, sglang_fakes: list[str], tiny_model: Path, tmp_path: Path) -> None:
    """transfer: distributed from where each backend holds its weights (the learner's module; verl's workers,
    each bucket gathered over both and broadcast by the first): after each update every replica holds exactly the
    staged checkpoint's tensors, none of which went through it. Small buckets, so a version takes several."""
    subject = open_backend(None)
    config = EngineConfig(kind="sglang", urls=sglang_fakes, transfer="distributed", group_backend="gloo",
                          bucket_mb=1, timeout_s=60, group_timeout_s=30)
    fleet = EngineFleet(config, sender=subject.backend.weight_sender("sglang"))
    try:
        committed = (tiny_model, 0)
        for version in (1, 2):
            subject.backend.update(ScoredGroups.of(good_vs_bad(subject.policy(), version - 1)), version=version - 1)
            staged = subject.backend.stage(tmp_path / "ckpt", TrainerState(version=version))
            assert len(buckets(staged, 1 << 20)) > 1
            await fleet.deliver(staged, version, committed)
            expected = fingerprint(read_folder(staged).items())
            assert await held_by(sglang_fakes) == [expected, expected]
            committed = (checkpoint.commit(tmp_path / "ckpt", staged, version), version)
        assert fleet.sender.joined()  # one group served both versions
    finally:
        await fleet.aclose()


async def test_verl_workers_replaced_form_the_weight_group_anew(
        tiny_model: Path, tmp_path: Path, verl_workers: tuple[VerlWorkers, Path], sglang_fakes: list[str]) -> None:
    """A worker lost mid-run takes the weight group's rank 0 with it: the next hand-over notices (the workers'
    generation moved), has the replicas leave the old group, and forms a new one with the new workers."""
    workers, fresh = verl_workers
    workers.load_checkpoint(fresh)
    backend = VerlBackend(config_for(tiny_model, tmp_path / "runs"), workers)
    config = EngineConfig(kind="sglang", urls=sglang_fakes, transfer="distributed", group_backend="gloo",
                          timeout_s=60, group_timeout_s=30)
    fleet = EngineFleet(config, sender=backend.weight_sender("sglang"))
    try:
        backend.update(ScoredGroups.of(good_vs_bad(exported(backend, tmp_path / "v0"))), version=0)
        first = backend.stage(tmp_path / "ckpt", TrainerState(version=1))
        await fleet.deliver(first, 1, (tiny_model, 0))
        workers.restart(fresh)  # as the backend does when a worker dies
        assert not fleet.sender.joined()
        second = backend.stage(tmp_path / "ckpt2", TrainerState(version=2))
        await fleet.deliver(second, 2, (first, 1))
        expected = fingerprint(read_folder(second).items())
        assert expected != fingerprint(read_folder(first).items())
        assert await held_by(sglang_fakes) == [expected, expected]
    finally:
        await fleet.aclose()
