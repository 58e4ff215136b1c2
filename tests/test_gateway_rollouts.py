"""The gateway's rollout registry: seal waits for calls in flight, and sealed rollouts do not pile up."""

from __future__ import annotations

import asyncio

import pytest

from gateway.errors import RolloutAlreadySealed, RolloutNotFound
from gateway.rollouts import Rollouts


async def test_sealed_rollouts_are_kept_only_up_to_a_bound() -> None:
    rollouts = Rollouts(max_sealed=3)
    for i in range(5):
        rollouts.register(f"r{i}", "run")
    live = rollouts.open("r0")
    rollouts.begin_call(live)
    sealing = asyncio.create_task(rollouts.seal("r0"))
    await asyncio.sleep(0.01)
    assert not sealing.done()  # waits for the call in flight
    with pytest.raises(RolloutAlreadySealed):
        rollouts.open("r0")
    rollouts.end_call(live, ["c0"])
    assert (await sealing).acknowledged == ["c0"]
    for i in range(1, 5):
        await rollouts.seal(f"r{i}")
    assert len(rollouts) == 3  # r0 and r1 are forgotten
    with pytest.raises(RolloutNotFound):
        rollouts.open("r0")
    with pytest.raises(RolloutAlreadySealed):
        rollouts.open("r4")
    assert (await rollouts.seal("r4")).acknowledged == []  # sealing again is harmless
