"""An ordinary tool-using agent on the openai SDK: it knows nothing of Tether but its environment variables.

    OPENAI_BASE_URL, OPENAI_API_KEY  where the model is (the gateway, bound to this rollout)
    TETHER_TASK                      the task, JSON: {"id": ..., "question": ..., "answer": ..., "facts": ...}
    TETHER_REWARD_URL                where to post the reward (optional)

The agent loops on its own: it may `lookup` a word (answered from the task's
`facts`, examples/lookup_task.py) or `submit` an answer; a malformed or
unknown tool call ends the episode with reward 0; after `--max-turns` model
calls without a submission it gives up with reward 0. It never rewrites or
drops earlier turns (a non-compacting harness).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import httpx
import openai

TOOLS = [
    {"type": "function", "function": {
        "name": "lookup", "description": "Look up what a word means.",
        "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}}},
    {"type": "function", "function": {
        "name": "submit", "description": "Submit the final answer.",
        "parameters": {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}}},
]
FACTS = {"x": "x means 42", "y": "y means 7"}  # for a task without facts of its own
SYSTEM = "Answer the question. Use lookup if you need to, then submit."


def act(task: dict[str, Any], name: str, arguments: Any) -> tuple[float | None, str]:
    """One tool call: (the episode's reward if it ends here, else None; what the tool answers)."""
    if not isinstance(arguments, dict):
        return 0.0, ""
    if name == "submit":
        return (1.0 if str(arguments.get("answer", "")).strip() == task["answer"] else 0.0), ""
    if name != "lookup":
        return 0.0, ""
    facts = task.get("facts") or FACTS
    return None, str(facts.get(str(arguments.get("word")), "unknown word"))


def run(task: dict[str, Any], max_turns: int, max_tokens: int) -> float:
    client = openai.OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
    messages: list[dict[str, object]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": task["question"]},
    ]
    for _ in range(max_turns):
        reply = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS,  # type: ignore[arg-type]
                                               max_tokens=max_tokens, temperature=1.0).choices[0].message
        messages.append(reply.model_dump(exclude_none=True))
        if not reply.tool_calls:
            messages.append({"role": "user", "content": "Use a tool."})
            continue
        for call in reply.tool_calls:
            try:
                arguments = json.loads(call.function.arguments)  # type: ignore[union-attr]
            except json.JSONDecodeError:
                return 0.0
            reward, answer = act(task, call.function.name, arguments)  # type: ignore[union-attr]
            if reward is not None:
                return reward
            messages.append({"role": "tool", "tool_call_id": call.id, "content": answer})
    return 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args()
    task = json.loads(os.environ.get("TETHER_TASK") or '{"id": "demo", "question": "What is x?", "answer": "42"}')
    reward = run(task, args.max_turns, args.max_tokens)
    url = os.environ.get("TETHER_REWARD_URL")
    if url:
        httpx.post(url, json={"reward": reward}, headers={"authorization": f"Bearer {os.environ['OPENAI_API_KEY']}"},
                   timeout=30).raise_for_status()
    print(json.dumps({"reward": reward}))
    sys.exit(0)


if __name__ == "__main__":
    main()
