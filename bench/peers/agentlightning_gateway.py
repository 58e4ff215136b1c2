"""Agent Lightning 1.0's gateway (`agl-server`: its LLM proxy and in-memory store in one process), started as its
own `agl-server` does, for bench/peer_gateway.py. Runs under the peer's own virtual environment (Python 3.12),
never Tether's.

After it answers it does what Agent Lightning's trainer and controller do before agents run: registers the
upstream as the model server (POST /api/models) and creates the rollouts, each running attempt "0"
(POST /api/rollouts, PATCH /api/rollouts/{id}); then prints "ready" and serves until SIGTERM. An agent's base URL
is /proxy/rollout/{id}/attempt/0/mode/train/openai/v1 (what its controller gives agents).

    PEER_PYTHON bench/peers/agentlightning_gateway.py --port 8300 --upstream http://127.0.0.1:8200/v1 --rollouts 64
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.resources

import httpx
import uvicorn
from agentlightning.server.app import create_app
from omegaconf import OmegaConf


async def serve(args: argparse.Namespace) -> None:
    config = OmegaConf.load(str(importlib.resources.files("agentlightning.config") / "server.yaml"))
    config.host, config.port, config.key = "127.0.0.1", args.port, ""
    config.default_proxy.model_name = args.model
    # agl-server's own uvicorn settings, its access log included
    server = uvicorn.Server(uvicorn.Config(create_app(config), host="127.0.0.1", port=args.port, workers=1,
                                          timeout_keep_alive=120))
    serving = asyncio.create_task(server.serve())
    while not server.started:
        if serving.done():
            return serving.result()
        await asyncio.sleep(0.05)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{args.port}") as http:
        (await http.post("/api/models", json=[{"model": args.model, "endpoint": args.upstream}])).raise_for_status()
        ids = [f"bench-{i}" for i in range(args.rollouts)]
        (await http.post("/api/rollouts", json=[{"rollout_id": r, "input": {}, "is_train": True}
                                                for r in ids])).raise_for_status()
        for r in ids:
            (await http.patch(f"/api/rollouts/{r}", json={"status": {"state": "running", "last_attempt_id": "0"}})
             ).raise_for_status()
    print("ready", flush=True)
    await serving


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="the engine's OpenAI base URL, /v1 included")
    parser.add_argument("--model", default="fake-vllm")
    parser.add_argument("--rollouts", type=int, default=64)
    asyncio.run(serve(parser.parse_args()))


if __name__ == "__main__":
    main()
