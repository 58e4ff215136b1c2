"""A benchmark harness: one model call through the gateway, then a heavy-tailed stretch of "work", then a reward.

Durations follow a Pareto law (alpha 1.5, scale --scale seconds, capped at --cap), seeded by the rollout
id, so the sync and async runs of bench/async_vs_sync.py see the same workload. Uses httpx, not the openai
SDK, to keep the process light: the benchmark measures scheduling, not interpreter start-up.
"""

import argparse
import hashlib
import os
import random
import time

import httpx

parser = argparse.ArgumentParser()
parser.add_argument("--scale", type=float, default=1.0)
parser.add_argument("--cap", type=float, default=20.0)
args = parser.parse_args()
rollout = os.environ["TETHER_ROLLOUT_ID"]
rng = random.Random(int(hashlib.sha256(rollout.split(".a")[0].encode()).hexdigest()[:8], 16))
headers = {"authorization": f"Bearer {os.environ['OPENAI_API_KEY']}"}
httpx.post(f"{os.environ['OPENAI_BASE_URL']}/chat/completions", headers=headers, timeout=300, json={
    "model": "policy", "max_tokens": 8, "messages": [{"role": "user", "content": "Pick one of A, B."}]},
).raise_for_status()
time.sleep(min(args.cap, args.scale * rng.paretovariate(1.5)))
httpx.post(os.environ["TETHER_REWARD_URL"], headers=headers, json={"reward": float(rng.random() < 0.5)},
           timeout=60).raise_for_status()
