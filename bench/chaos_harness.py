"""The chaos bench's harness: an openai-SDK agent making a call every `--interval` seconds for `--turns` turns.

    OPENAI_BASE_URL, OPENAI_API_KEY  the gateway, bound to this rollout (set by the controller)
    TETHER_REWARD_URL                where the reward goes at the end

Calls alternate non-streaming and streaming (the SDK's own retries, two by
default, as shipped); the conversation grows turn by turn, never rewritten.
Each call appends one JSON line to `--out` as it ends: start and end (epoch
seconds), whether it streamed, "ok" or the error, and the response id the
gateway answered with (the `id` of the completion, or of a stream's chunks),
which is the `id` inside the recorded ModelCall's response_json. A call that
fails past the SDK's retries ends the episode with exit code 1, as an
ordinary harness would fail.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import openai
from openai.types.chat import ChatCompletionChunk


def one_call(client: openai.OpenAI, messages: list[dict[str, Any]], stream: bool, max_tokens: int
             ) -> tuple[str, str]:
    """(response id, reply text)."""
    if not stream:
        reply = client.chat.completions.create(model="policy", messages=messages,  # type: ignore[arg-type]
                                               max_tokens=max_tokens, temperature=1.0)
        return reply.id, reply.choices[0].message.content or ""
    chunks: openai.Stream[ChatCompletionChunk] = client.chat.completions.create(
        model="policy", messages=messages, max_tokens=max_tokens, temperature=1.0, stream=True)  # type: ignore[arg-type, assignment]
    rid, text = "", []
    for chunk in chunks:
        rid = rid or chunk.id
        for choice in chunk.choices:
            text.append(choice.delta.content or "")
    if not rid:
        raise RuntimeError("a stream without chunks")
    return rid, "".join(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="the JSON lines file of this rollout's calls")
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--max-tokens", type=int, default=8)
    args = parser.parse_args()
    client = openai.OpenAI()  # default max_retries=2, as a harness ships
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Count with me: one."}]
    replies: list[str] = []
    code = 0
    with args.out.open("a") as out:
        for turn in range(args.turns):
            stream = turn % 2 == 1
            started = time.time()
            line: dict[str, Any] = {"turn": turn, "stream": stream, "start": started}
            try:
                rid, text = one_call(client, messages, stream, args.max_tokens)
                line |= {"end": time.time(), "status": "ok", "id": rid}
            except Exception as exc:  # what the harness saw, past the SDK's retries
                status = getattr(exc, "status_code", None)
                line |= {"end": time.time(), "status": f"{type(exc).__name__}" + (f" {status}" if status else ""),
                         "error": str(exc)[:300]}
                out.write(json.dumps(line) + "\n")
                out.flush()
                code = 1
                break
            out.write(json.dumps(line) + "\n")
            out.flush()
            replies.append(text)
            messages += [{"role": "assistant", "content": text}, {"role": "user", "content": f"and {turn + 2}?"}]
            time.sleep(max(0.0, args.interval - (time.time() - started)))
    if code == 0 and os.environ.get("TETHER_REWARD_URL"):
        digest = hashlib.sha256("".join(replies).encode()).digest()
        reward = digest[0] / 255  # varies across a group, so GRPO has advantages to train on
        httpx.post(os.environ["TETHER_REWARD_URL"], json={"reward": reward},
                   headers={"authorization": f"Bearer {os.environ['OPENAI_API_KEY']}"}, timeout=60).raise_for_status()
    sys.exit(code)


if __name__ == "__main__":
    main()
