"""No re-tokenisation drift: an unmodified multi-turn harness's calls extend each other, call after call."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pytest

from schemas.events import ModelCall
from schemas.rollout_token import mint
from schemas.settings import BusSettings
from tests.conftest import SECRET, RunningGateway
from tests.test_gateway_openai import recorded

AGENT = Path(__file__).parent.parent / "examples" / "openai_agent.py"


def run_agent(gw: RunningGateway, max_turns: int) -> tuple[str, float]:
    rollout_id = f"r-{uuid.uuid4().hex[:10]}"
    gw.register(rollout_id)
    env = {**os.environ, "OPENAI_BASE_URL": f"{gw.url}/v1", "OPENAI_API_KEY": mint(rollout_id, SECRET),
           "TETHER_TASK": json.dumps({"id": "t", "question": "What is x?", "answer": "42"}),
           "TETHER_REWARD_URL": f"{gw.url}/rollouts/{rollout_id}/reward", "TETHER_ROLLOUT_ID": rollout_id}
    done = subprocess.run([sys.executable, str(AGENT), "--max-turns", str(max_turns), "--max-tokens", "24"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return rollout_id, json.loads(done.stdout.strip().splitlines()[-1])["reward"]


def extension_rate(calls: list[ModelCall]) -> float:
    calls = sorted(calls, key=lambda c: c.seq)
    pairs = list(itertools.pairwise(calls))
    ok = sum(b.prompt_token_ids[:len(a.prompt_token_ids) + len(a.response_token_ids)]
             == a.prompt_token_ids + a.response_token_ids for a, b in pairs)
    return ok / len(pairs) if pairs else 1.0


@pytest.mark.parametrize("which", ["tiny-model", "scripted-tool-calls"])
def test_every_call_extends_the_previous_one(which: str, gateway_server: RunningGateway,
                                             scripted_gateway: RunningGateway, bus: BusSettings) -> None:
    gw = gateway_server if which == "tiny-model" else scripted_gateway
    turns = 4 if which == "tiny-model" else 3
    rates = []
    for _ in range(3):
        rollout_id, reward = run_agent(gw, turns)
        sealed = httpx.post(f"{gw.url}/admin/rollouts/{rollout_id}/seal", headers=gw.admin(), timeout=60).json()
        events = asyncio.run(recorded(bus, rollout_id, sealed["n_calls"] + 1))
        calls = [c for c in events if isinstance(c, ModelCall) and c.call_id in sealed["call_ids"]]
        assert len(calls) == sealed["n_calls"] >= 2
        rates.append(extension_rate(calls))
        if which == "scripted-tool-calls":
            assert reward == 0.0  # the script looks "x" up and then answers in text: no submit
    assert rates == [1.0, 1.0, 1.0]
