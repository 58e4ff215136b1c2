"""Seeds end to end: a rollout's seed from the run's, and each call's from its rollout's.

The controller gives every rollout a seed drawn from the run's seed, the task
and the rollout's index in its group (recorded in `RolloutStarted`, given to
the harness as `TETHER_SEED`, carried in its token); the gateway gives a call
that names no seed one drawn from its rollout's seed and the call's sequence
number, and records the seed it used. So two runs with the same seed give
their rollouts the same seeds, which is what pairs them call by call, and a
harness that retries a call gets a new seed for the retry (a new sequence
number), as an unseeded engine would draw anew.

Seeds are 63-bit (0 to 2**63 - 1): every engine takes them (vLLM, SGLang and
the embedded engine), and so does the record's Avro long.
"""

from __future__ import annotations

import hashlib

MAX_SEED = 2**63 - 1


def _digest(*parts: object) -> bytes:
    """The same on every machine and Python (no `hash()`: it is salted)."""
    return hashlib.sha256("|".join(map(str, parts)).encode("utf-8", "surrogatepass")).digest()


def _draw(*parts: object) -> int:
    """A 63-bit integer from the parts."""
    return int.from_bytes(_digest(*parts)[:8], "big") >> 1


def rollout_seed(run_seed: int, task_id: str, index: int, validation: bool = False) -> int:
    """The seed of the `index`-th rollout of the task's group. Validation rollouts draw apart from training ones
    (a held-out task may share an id with a training task), and the same in every validation round, so rounds
    differ only by the weights."""
    return _draw("tether-rollout", run_seed, "validation" if validation else "training", index, task_id)


def call_seed(rollout_seed: int, seq: int) -> int:
    """The sampling seed of the rollout's call number `seq` where the harness sent none."""
    return _draw("tether-call", rollout_seed, seq)


def seeded_name(seed: int, seq: int, *parts: object) -> str:
    """64 hex digits naming something a seeded call answers with and a harness sends back (its response's id,
    its tool calls' ids): random names would make a rerun's next request differ. Distinct per call (`seq`) and
    per `parts` (the choice, the place of a tool call)."""
    return _digest("tether-name", seed, seq, *parts).hex()
