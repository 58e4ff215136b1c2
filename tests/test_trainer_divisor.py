"""The loss divisor, held by property tests: each task, rollout, segment and token weighs what `loss_mode` says,
however a harness's rollouts were split into segments, for both update backends (docs/architecture.md: "Tokens",
"Per-task normalisation", "Epochs and mini-batches", "The verl backend").

What each trainable token weighs is read off the code, not recomputed. Every rollout is given advantage 1 (a
`ScoredGroups` of ones) and every policy gives every token the same log-probability LP0, which is also its
behaviour log-prob, so ratio and importance weight are 1 and the scalar an optimiser step descends is
L = -Σ_t c_t·ratio_t: ∂L/∂log π(t) = -c_t, the token's coefficient in the loss.

- torch: `TorchLearner.update` (packing, micro-batches, mini-batch scaling, epochs) on a stand-in model that is one
  bias vector over the vocabulary, log π(y) = b_y - logsumexp(b). For a target y that one trainable position holds,
  ∂L/∂b_y = -c_y + Σc/V, and Σc/V is what an id that no segment holds gets.
- verl: `VerlBackend.update` (layout, filler rows, mini-batch scaling) and `VerlWorkers.update` (what verl is
  handed), on a stand-in worker group that runs `workers.tether_loss` as verl's engine runs a loss
  (`StandInGroup`), without Ray.

Trainable token ids are unique in a batch, so a coefficient is keyed by its token's id. The readers live in
tests/loss_weights.py; here are the batches and what the configuration says each token weighs.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, replace
from typing import Any, cast, get_args

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.events import CallSpan, RolloutSample, Segment, StepReward, TaskGroup
from stream_processors.assembly import Call, assemble
from tests.factories import T0
from tests.loss_weights import (
    LP0,
    UNUSED,
    Weights,
    Where,
    config,
    one_step,
    torch_steps,
    trainable,
    verl_run,
    verl_steps,
)
from trainer.advantages import AdvantageRecipe, ScoredGroups
from trainer.algorithms import Credit, LossMode
from trainer.batch import build_batch
from trainer.selection import select

MODES: tuple[LossMode, ...] = get_args(LossMode)
VARIANTS = ("merged", "by calls", "per call", "cut")
credits: st.SearchStrategy[Credit] = st.sampled_from(get_args(Credit))

Batch = dict[str, list[TaskGroup]]  # the same task groups, their rollouts split into segments as each variant says


def near(expected: Any) -> Any:
    """Equal within float32 noise."""
    return pytest.approx(expected, rel=1e-4, abs=1e-7)


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """The tensors here are tiny: one thread is several times faster than two waiting on each other."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# -- the same rollouts, split in different ways ----------------------------------------------------------------------

class Ids:
    """Fresh token ids, unique in a batch (0 is verl's padding; UNUSED stays unused)."""

    def __init__(self) -> None:
        self.next = 1

    def take(self, n: int) -> list[int]:
        out = list(range(self.next, self.next + n))
        self.next += n
        assert self.next < UNUSED
        return out


def assembled(turns: list[tuple[list[int], list[int]]], plan: list[float | None]) -> list[Segment]:
    """A rollout's calls (new prompt tokens, response) through the stream processors' assembly. `plan`, for each call
    after the first: None, its prompt extends everything before (one segment); f, the harness compacted or rewrote
    its history, keeping the first f of it and adding the new tokens (a new segment)."""
    calls: list[Call] = []
    history: list[int] = []
    for seq, ((fresh, response), keep) in enumerate(zip(turns, [None, *plan], strict=True)):
        prompt = history + fresh if keep is None else history[:int(keep * len(history))] + fresh
        calls.append(Call(call_id=f"c{seq}", seq=seq, choice_index=0, prompt_token_ids=prompt,
                          response_token_ids=response, response_logprobs=[LP0] * len(response), weight_version=0))
        history = prompt + response
    segments = assemble(calls)
    assert len(segments) == 1 + sum(keep is not None for keep in plan)
    return segments


def cut(s: Segment, at: int, keep: int) -> list[Segment]:
    """`s` split before token `at`: the head as it was, and a tail that repeats the `keep` tokens before `at`,
    masked out (the context sent again), then goes on as `s` did. Every trainable target stays one."""
    head = Segment(token_ids=s.token_ids[:at], loss_mask=s.loss_mask[:at], logprobs=s.logprobs[:at],
                   weight_versions=s.weight_versions[:at],
                   spans=[CallSpan(seq=p.seq, start=p.start, end=min(p.end, at)) for p in s.spans if p.start < at])
    shift = keep - at
    tail = Segment(token_ids=s.token_ids[at - keep:], loss_mask=[False] * keep + s.loss_mask[at:],
                   logprobs=[0.0] * keep + s.logprobs[at:], weight_versions=s.weight_versions[at - keep:],
                   spans=[CallSpan(seq=p.seq, start=max(p.start, at) + shift, end=p.end + shift)
                          for p in s.spans if p.end > at])
    return [head, tail]


@st.composite
def rollout_variants(draw: st.DrawFn, ids: Ids) -> dict[str, list[Segment]]:
    turns = [(ids.take(draw(st.integers(1, 4 if seq == 0 else 3))), ids.take(draw(st.integers(1, 5))))
             for seq in range(draw(st.integers(1, 4)))]
    later = len(turns) - 1
    fraction = st.floats(0, 0.99)
    by_calls = assembled(turns, draw(st.lists(st.none() | fraction, min_size=later, max_size=later)))
    cuts = [draw(st.none() | st.integers(1, len(s.token_ids) - 1).flatmap(
        lambda at: st.tuples(st.just(at), st.integers(1, at)))) for s in by_calls]
    return {"merged": assembled(turns, [None] * later),  # every prompt extends the last: one segment
            "by calls": by_calls,  # some calls compact or rewrite the history
            "per call": assembled(turns, draw(st.lists(fraction, min_size=later, max_size=later))),
            "cut": [part for s, at in zip(by_calls, cuts, strict=True) for part in (cut(s, *at) if at else [s])]}


@dataclass
class Drawn:
    batch: Batch
    ids: Ids


@st.composite
def batches(draw: st.DrawFn) -> Drawn:
    """1-3 tasks of 1-3 rollouts of 1-4 calls, each rollout in every variant (same trainable tokens and rewards)."""
    ids = Ids()
    batch: Batch = {v: [] for v in VARIANTS}
    for g in range(draw(st.integers(1, 3))):
        rollouts: dict[str, list[RolloutSample]] = {v: [] for v in VARIANTS}
        for r in range(draw(st.integers(1, 3))):
            variants = draw(rollout_variants(ids))
            reward = draw(st.sampled_from([0.0, 0.5, 1.0]))
            steps = draw(st.dictionaries(st.integers(0, 3), st.sampled_from([-0.5, 0.25, 1.0]), max_size=2))
            for v in VARIANTS:
                rollouts[v].append(RolloutSample(
                    rollout_id=f"g{g}-r{r}", reward=reward, status="succeeded", segments=variants[v],
                    step_rewards=[StepReward(seq=seq, reward=x) for seq, x in sorted(steps.items())]))
        for v in VARIANTS:
            batch[v].append(TaskGroup(group_id=f"g{g}", run_id="divisor", task_id=f"t{g}",
                                      group_size=len(rollouts[v]), created_at=T0, rollouts=rollouts[v]))
    return Drawn(batch, ids)


# -- what the configuration says they weigh --------------------------------------------------------------------------

def sums(weights: Weights, where: dict[int, Where], unit: str) -> dict[Hashable, list[float]]:
    out: dict[Hashable, list[float]] = defaultdict(list)
    for y, w in weights.items():
        out[getattr(where[y], unit)].append(w)
    return out


def check(mode: LossMode, groups: list[TaskGroup], weights: Weights, absolute: bool = True) -> None:
    """What docs/architecture.md says each part of a whole batch weighs in `mode`. per-task: every task with a
    trainable token 1/|G'|, every such rollout of it 1/(|G'|·|g'|), spread evenly over its tokens; token-mean: every
    token 1/N; seq-mean-token-mean: every segment with a trainable token 1/S, spread evenly over its tokens.
    `absolute` False: only the parts' weights relative to each other."""
    where = trainable(groups)
    assert set(weights) == set(where)
    if not where:
        return
    scale = sum(weights.values()) if not absolute else 1.0
    assert scale > 0
    w = {y: v / scale for y, v in weights.items()}
    if mode == "per-task":
        tasks, rollouts = sums(w, where, "group"), sums(w, where, "rollout")
        for g, values in tasks.items():
            assert sum(values) == near(1 / len(tasks))
            live = [key for key in rollouts if cast(tuple[int, int], key)[0] == g]
            for key in live:
                assert sum(rollouts[key]) == near(1 / len(tasks) / len(live))
                assert max(rollouts[key]) - min(rollouts[key]) <= 1e-6 * max(rollouts[key])
    elif mode == "token-mean":
        assert list(w.values()) == near([1 / len(w)] * len(w))
    else:
        segments = sums(w, where, "segment")
        for values in segments.values():
            assert sum(values) == near(1 / len(segments))
            assert max(values) - min(values) <= 1e-6 * max(values)


def rollout_weights(weights: Weights, groups: list[TaskGroup]) -> dict[Hashable, float]:
    return {key: sum(values) for key, values in sums(weights, trainable(groups), "rollout").items()}


# -- the properties --------------------------------------------------------------------------------------------------

@settings(max_examples=30)
@given(batches(), st.sampled_from([None, 64, 128]), st.integers(1, 3))
def test_torch_weighs_each_task_rollout_and_token_as_the_mode_says_however_rollouts_are_split(
        drawn: Drawn, row_tokens: int | None, rows_per_micro_batch: int) -> None:
    """One optimiser step (epochs = mini_batches = 1), rows packed up to `row_tokens`, micro-batches of
    `rows_per_micro_batch` rows. per-task and token-mean: each token's coefficient is the same whether its rollout
    came as one segment, a segment per call, segments split where the harness compacted, or cut anywhere with the
    context repeated masked out. seq-mean-token-mean weighs segments, so a rollout weighs its share of the batch's
    segments: splitting it makes it weigh more (as documented; not invariant)."""
    batch = drawn.batch
    for mode in MODES:
        c = config(mode, row_tokens=row_tokens, rows_per_micro_batch=rows_per_micro_batch)
        weights = {v: one_step(torch_steps(groups, c)) for v, groups in batch.items()}
        for v, groups in batch.items():
            check(mode, groups, weights[v])
            if mode == "seq-mean-token-mean":
                segments = sums(weights[v], trainable(groups), "segment")
                for key, total in rollout_weights(weights[v], groups).items():
                    own = [s for s in segments if cast(tuple[int, int, int], s)[:2] == key]
                    assert total == near(len(own) / len(segments))
            else:
                assert weights[v] == near(weights["merged"])


@settings(max_examples=30)
@given(batches(), st.booleans(), credits)
def test_every_token_carries_the_same_advantage_however_its_rollout_is_split(
        drawn: Drawn, normalise_by_std: bool, credit: Credit) -> None:
    """The other factor of a token's gradient: the advantage the batch gives it (its rollout's, or with credit
    per call its call's), whatever the segments."""
    recipe = AdvantageRecipe(normalise_by_std=normalise_by_std, credit=credit)
    found: dict[str, dict[int, float]] = {}
    for v, groups in drawn.batch.items():
        t = build_batch(ScoredGroups.of(groups, recipe)).batch
        found[v] = {int(t["targets"][i, p]): float(t["advantages"][i, p])
                    for i, p in (t["loss_mask"] > 0).nonzero().tolist()}
        assert set(found[v]) == set(trainable(groups))
    for v in VARIANTS:
        assert found[v] == pytest.approx(found["merged"], abs=1e-6)


@settings(max_examples=20)
@given(batches(), st.integers(1, 3))
def test_verl_weighs_every_token_as_the_torch_learner_does(drawn: Drawn, workers: int) -> None:
    """One optimiser step through `VerlBackend` (one row per segment, filler rows up to a multiple of workers times
    MICRO_BATCH, `tether_loss` per micro-batch, FSDP's mean over the ranks): per-task and token-mean give every
    token the same coefficient in every split variant; in every mode each token weighs what the torch learner gives
    it on the most split one (seq-mean-token-mean: every segment 1/S, fillers uncounted)."""
    for mode in MODES:
        c = config(mode, workers=workers)
        weights = {v: one_step(verl_steps(groups, c)) for v, groups in drawn.batch.items()}
        for v, groups in drawn.batch.items():
            check(mode, groups, weights[v])
            if mode != "seq-mean-token-mean":
                assert weights[v] == near(weights["merged"])
        assert weights["cut"] == near(one_step(torch_steps(drawn.batch["cut"], c)))


def check_steps(mode: LossMode, groups: list[TaskGroup], whole: Weights, steps: list[Weights], epochs: int,
                absolute: bool) -> None:
    """Epochs repeat the same steps; in an epoch each token is in one step; in per-task mode each step's weights
    are the whole batch's scaled to a whole batch's mass (so the step sums to 1); the other modes normalise by the
    step's own tokens or segments."""
    trained = [s for s in steps if any(w > 1e-9 for w in s.values())]
    assert len(trained) % epochs == 0
    per_epoch = len(trained) // epochs
    for e in range(1, epochs):
        for j in range(per_epoch):
            assert trained[e * per_epoch + j] == near(trained[j])
    where = trainable(groups)
    for y in where:
        assert sum(step[y] > 1e-9 for step in trained[:per_epoch]) == 1
    for step in trained:
        inside = {y: w for y, w in step.items() if w > 1e-9}
        if absolute:
            assert sum(inside.values()) == near(1.0)
        if mode == "per-task":  # the whole batch's weights, scaled alike
            ratios = [w / whole[y] for y, w in inside.items()]
            assert max(ratios) - min(ratios) <= 1e-4 * max(ratios)
        elif mode == "token-mean":  # every token of the step alike
            values = list(inside.values())
            assert max(values) - min(values) <= 1e-4 * max(values)
        else:  # every segment of the step alike, evenly over its tokens
            segments = sums(inside, where, "segment")
            totals = [sum(v) for v in segments.values()]
            assert max(totals) - min(totals) <= 1e-4 * max(totals)
            for values in segments.values():
                assert max(values) - min(values) <= 1e-6 * max(values)


@settings(max_examples=20)
@given(batches(), st.integers(2, 3), st.integers(1, 2), st.integers(1, 3), st.sampled_from([None, 64]))
def test_each_optimiser_step_weighs_as_the_mode_says_with_mini_batches_and_epochs(
        drawn: Drawn, mini_batches: int, epochs: int, workers: int, row_tokens: int | None) -> None:
    """`epochs` passes of `mini_batches` optimiser steps, in both backends (each splits the rows its own way: the
    torch learner in order, verl by rank then in order): see `check_steps`. verl is given no mini-batch without a
    token to train (it would step the optimiser on it)."""
    groups = drawn.batch["by calls"]
    for mode in MODES:
        c = config(mode, mini_batches=mini_batches, epochs=epochs, workers=workers, row_tokens=row_tokens)
        whole = one_step(torch_steps(groups, config(mode, row_tokens=row_tokens)))
        check_steps(mode, groups, whole, torch_steps(groups, c), epochs, absolute=True)
        check_steps(mode, groups, whole, verl_steps(groups, c), epochs, absolute=True)
        assert all(n > 0 for n in verl_run(groups, c).tokens)


def flat_group(ids: Ids, gid: str, rollouts: int, reward: float) -> TaskGroup:
    """A group with trainable tokens and no signal: every rollout rewarded the same (or only one rollout)."""
    return TaskGroup(group_id=gid, run_id="divisor", task_id=gid, group_size=rollouts, created_at=T0, rollouts=[
        RolloutSample(rollout_id=f"{gid}-r{r}", reward=reward, status="succeeded",
                      segments=assembled([(ids.take(2), ids.take(3))], []))
        for r in range(rollouts)])


def idle_rollouts(ids: Ids, gid: str, reward: float) -> list[RolloutSample]:
    """Rollouts with nothing to train: no segments; a one-token segment (a first token is no target); segments whose
    loss mask is all off."""
    masked = Segment(token_ids=ids.take(4), loss_mask=[False] * 4, logprobs=[0.0] * 4, weight_versions=[0] * 4)
    single = Segment(token_ids=ids.take(1), loss_mask=[True], logprobs=[LP0], weight_versions=[0])
    return [RolloutSample(rollout_id=f"{gid}-idle{k}", reward=reward, status="succeeded", segments=segments)
            for k, segments in enumerate([[], [single], [masked, masked], [single, masked]])]


@settings(max_examples=15)
@given(batches(), st.integers(1, 3), st.sampled_from([0.0, 1.0]), st.booleans(), credits)
def test_padding_idle_rollouts_and_no_signal_groups_leave_the_others_weights(
        drawn: Drawn, workers: int, reward: float, normalise_by_std: bool, credit: Credit) -> None:
    """Rows padded to a micro-batch's longest, verl's filler rows, rollouts and a whole task with no trainable token:
    the others' coefficients are what they were, in both backends and every mode. With `zero_variance: drop` (the
    default) a group without signal changes nothing either. With `keep` it is a task like the others, advantage 0:
    docs/architecture.md's G' counts every group with a trainable token, so it does take its 1/|G'| share from the
    others."""
    base, ids = drawn.batch["by calls"], drawn.ids
    padded = [replace(g, rollouts=[*g.rollouts, *idle_rollouts(ids, g.group_id, reward)], group_size=g.group_size + 4)
              for g in base]
    padded.append(TaskGroup(group_id="idle", run_id="divisor", task_id="idle", group_size=4, created_at=T0,
                            rollouts=idle_rollouts(ids, "idle", 1.0)))
    flat = [flat_group(ids, "flat", 3, reward), flat_group(ids, "single", 1, 1.0 - reward)]
    recipe = AdvantageRecipe(normalise_by_std=normalise_by_std, credit=credit)
    assert select([*base, *flat], 0, 2, "drop", recipe).groups == select(base, 0, 2, "drop", recipe).groups
    kept = select([*base, *flat], 0, 2, "keep", recipe).groups
    assert kept == [*base, *flat]
    for mode in MODES:
        c = config(mode, workers=workers, rows_per_micro_batch=2)
        for steps in (torch_steps, verl_steps):
            assert one_step(steps(padded, c)) == near(one_step(steps(base, c)))
            check(mode, kept, one_step(steps(kept, c)))  # G' counts the flat groups too


def test_verl_seq_mean_token_mean_divides_by_the_segments_it_trains() -> None:
    """Three one-segment rollouts, two workers: verl's rows are a multiple of 2·MICRO_BATCH, so one filler row.
    Each segment should weigh 1/3 (docs: the mean over segments), as in the torch learner; verl's own divisor,
    global_batch_size, counts the filler and gave it 1/4."""
    ids = Ids()
    groups = [TaskGroup(group_id="g", run_id="divisor", task_id="t", group_size=3, created_at=T0, rollouts=[
        RolloutSample(rollout_id=f"r{r}", reward=float(r % 2), status="succeeded",
                      segments=assembled([(ids.take(2), ids.take(2 + r))], [])) for r in range(3)])]
    c = config("seq-mean-token-mean", workers=2)
    by_torch, by_verl = one_step(torch_steps(groups, c)), one_step(verl_steps(groups, c))
    assert by_verl == near(by_torch), \
        f"segments weigh {rollout_weights(by_verl, groups)} in verl, {rollout_weights(by_torch, groups)} in torch"


def test_verl_takes_no_optimiser_step_on_filler_rows_only() -> None:
    """Two one-segment rollouts, one worker, two mini-batches: 4 rows; laid out [a, b, filler, filler] the second
    mini-batch had nothing to train. Each of the two steps has a segment."""
    ids = Ids()
    groups = [TaskGroup(group_id="g", run_id="divisor", task_id="t", group_size=2, created_at=T0, rollouts=[
        RolloutSample(rollout_id=f"r{r}", reward=float(r), status="succeeded",
                      segments=assembled([(ids.take(2), ids.take(3))], [])) for r in range(2)])]
    tokens = verl_run(groups, config("per-task", workers=1, mini_batches=2)).tokens
    assert len(tokens) == 2 and all(n > 0 for n in tokens), f"trainable tokens of verl's mini-batches: {tokens}"


def test_the_stand_ins_read_the_loss_as_a_hand_computation_does() -> None:
    """The readers themselves: two tasks, per-task, by hand. Task a: rollouts of 2 and 4 trainable tokens; task b:
    one rollout of 1 token (and one with 3, split over two calls that compact)."""
    ids = Ids()
    a = [assembled([(ids.take(2), ids.take(2))], []), assembled([(ids.take(2), ids.take(4))], [])]
    b = [assembled([(ids.take(1), ids.take(1))], []),
         assembled([(ids.take(1), ids.take(2)), (ids.take(1), ids.take(1))], [0.5])]
    groups = [TaskGroup(group_id=gid, run_id="divisor", task_id=gid, group_size=2, created_at=T0, rollouts=[
        RolloutSample(rollout_id=f"{gid}{r}", reward=float(r), status="succeeded", segments=s)
        for r, s in enumerate(rollouts)]) for gid, rollouts in (("a", a), ("b", b))]
    expected = [1 / 2 / 2 / 2] * 2 + [1 / 2 / 2 / 4] * 4 + [1 / 2 / 2 / 1] + [1 / 2 / 2 / 3] * 3
    for steps in (torch_steps, verl_steps):
        found = one_step(steps(groups, config("per-task", workers=2)))
        assert [found[y] for y in sorted(found)] == near(expected)
        assert math.isclose(sum(found.values()), 1.0, rel_tol=1e-5)
