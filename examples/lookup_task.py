"""The lookup task: the answer is only in tool results, one to three lookups away, with facts drawn per task.

A task shows three words and asks for the number of one of them. Looking a
word up (`lookup`) answers either with a number or with another word to look
up next; the chain is one, two or three lookups long, and the other words
lead to numbers of their own. Nothing can be memorised: the words, the chain
and the numbers are drawn at random for each task. A rollout of one task can
be two model calls or many: an agent that looks up the wrong word, or the
same word twice, spends calls, so rollouts of one task differ in how many
samples they give the trainer.

The harness is the demo's ordinary openai-SDK agent (`examples/openai_agent.py`):
its `lookup` tool answers from the task's `facts`. Make a dataset:

    python examples/lookup_task.py --tasks 256 --seed 1 > tasks.jsonl
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import re
import sys
from typing import Any

#: Words that are one token in the tiny model's vocabulary, with and without a leading space.
WORDS = ("file line error test function value return list answer question tool call result letter option task "  # noqa: SIM905
         "agent search read write run check open close start stop data key name item total first last next code "
         "class print self time").split()
DEPTHS = (1, 2, 3)
SHOWN = 3  # words the question shows: the one asked for, and two that lead elsewhere
LOW, HIGH = 10, 99  # the numbers
QUOTED = re.compile(r'"([a-z]+)"')


def task(rng: random.Random, index: int, depth: int | None = None) -> dict[str, Any]:
    """One task: `facts` maps each word the harness can look up to what the lookup answers."""
    depth = depth or rng.choice(DEPTHS)
    words = rng.sample(WORDS, depth + SHOWN - 1)
    chain, others = words[:depth], words[depth:]
    answer = rng.randint(LOW, HIGH)
    facts = {a: f'"{a}" is "{b}".' for a, b in itertools.pairwise(chain)}
    facts[chain[-1]] = f'"{chain[-1]}" is {answer}.'
    facts.update({w: f'"{w}" is {rng.randint(LOW, HIGH)}.' for w in others})
    shown = [chain[0], *others]
    rng.shuffle(shown)
    return {"id": f"lookup-{index}", "question": f"Words: {', '.join(quoted(w) for w in shown)}. What number is "
                                                 f"{quoted(chain[0])}?",
            "answer": str(answer), "facts": facts, "depth": depth}


def quoted(word: str) -> str:
    """Words are written in quotes everywhere (question, answers, the call's JSON), so that a word is the same
    token wherever it appears: what the agent copies is what it saw."""
    return f'"{word}"'


def words_in(text: str) -> list[str]:
    return QUOTED.findall(text)


Turn = tuple[list[dict[str, Any]], dict[str, Any]]
"""The conversation so far (after the system turn) and the tool call made next."""


def random_turns(rng: random.Random, t: dict[str, Any], max_turns: int) -> list[Turn]:
    """An agent with the tool-call format and no idea what to do: it looks up a word it has seen until a lookup
    has given it a number, then each turn looks up a word it has seen or submits a number it has seen, at even
    odds. The warm-start learns the format from these (about 0.16 of them end right); which word to look up and
    when to stop is the policy RL has to learn."""
    seen_words = list(dict.fromkeys(words_in(t["question"])))
    seen_numbers: list[str] = []
    messages: list[dict[str, Any]] = [{"role": "user", "content": t["question"]}]
    turns: list[Turn] = []
    for n in range(max_turns):
        if not seen_numbers or rng.random() < 0.5:
            call: dict[str, Any] = {"name": "lookup", "arguments": {"word": rng.choice(seen_words)}}
        else:
            call = {"name": "submit", "arguments": {"answer": rng.choice(seen_numbers)}}
        turns.append(([dict(m) for m in messages], call))
        if call["name"] == "submit":
            break
        word = call["arguments"]["word"]
        fact = t["facts"].get(word, "unknown word")
        messages.append({"role": "assistant", "content": "", "tool_calls": [
            {"id": f"call_{n}", "type": "function",
             "function": {"name": "lookup", "arguments": json.dumps(call["arguments"])}}]})
        messages.append({"role": "tool", "tool_call_id": f"call_{n}", "content": fact})
        found = fact.rstrip(".").split(" is ")[-1]
        if found.isdigit():
            seen_numbers.append(found)
        seen_words += [w for w in words_in(fact) if w not in seen_words]
    return turns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prefix", default="lookup", help="Task ids are PREFIX-N.")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    for i in range(args.tasks):
        t = task(rng, i)
        t["id"] = f"{args.prefix}-{i}"
        sys.stdout.write(json.dumps(t) + "\n")


if __name__ == "__main__":
    main()
