"""Two runs read from the topics and compared: what `tether diverge` and the divergence bench print."""

from __future__ import annotations

from repro.diverge import Comparison, compare, rollouts
from schemas.calls import whole
from schemas.events import ModelCall
from schemas.settings import BusSettings
from stream_processors.grouping import Policy
from stream_processors.pipeline import rebuild, training_hash
from stream_processors.replay import read_run_events


async def compare_runs(bus: BusSettings, run_a: str, run_b: str, policy: Policy) -> Comparison:
    """The runs paired call by call, with each run's training data hash (its groups rebuilt under `policy`)."""
    paired, hashes = {}, []
    for run in (run_a, run_b):
        events = await read_run_events(bus, run)
        calls = whole(e for e in events if isinstance(e, ModelCall))
        paired[run] = rollouts([*(e for e in events if not isinstance(e, ModelCall)), *calls], run)
        hashes.append(training_hash(rebuild(events, run, policy), run))
    comparison = compare(run_a, paired[run_a], run_b, paired[run_b])
    comparison.training = (hashes[0], hashes[1])
    return comparison
