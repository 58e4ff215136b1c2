"""A short supervised warm-start: teach the tiny random model the tool-call format of a demo task.

Real RL starts from a capable model; a random one never emits a valid
`<tool_call>`, so GRPO would see only zeros. The transcripts are what the demo
agent (examples/openai_agent.py) sends, rendered with the model's chat
template, each followed by the call an agent with the format and no policy
makes next (`Turns`). For the letters task that is a `submit` with a letter
drawn uniformly from the options: about a sixth of its answers are right and
RL has something to learn from. For the lookup task (examples/lookup_task.py)
it is a lookup of a word seen or a submission of a number seen, at even odds.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tether.supervised import Batch, fit

Turn = tuple[list[dict[str, Any]], dict[str, Any]]
"""The conversation after the system turn, and the tool call ({"name", "arguments"}) to learn to make next."""
Turns = Callable[[random.Random], list[Turn]]
"""One episode of the format-only policy: its turns."""

LETTERS = "ABCDEFGH"
OPTIONS = 6  # letters per question: chance is 1/6 (five letters gave baselines of 0.08 and 0.32)


def task(rng: random.Random, index: int) -> dict[str, str]:
    """A demo task: six letters, A among them at a random place; the right answer is A.

    The warm-start teaches the format and a letter drawn from the options, so about one answer in six
    is right at the start; RL has to learn to follow the instruction."""
    options = ["A", *rng.sample(LETTERS[1:], OPTIONS - 1)]
    rng.shuffle(options)
    return {"id": f"letters-{index}", "question": f"Pick one of {', '.join(options)}. Submit A.",
            "answer": "A", "options": "".join(options)}


def letter_turns(rng: random.Random) -> list[Turn]:
    """The letters task: one submission of a letter drawn from the options."""
    t = task(rng, -1)
    return [([{"role": "user", "content": t["question"]}],
             {"name": "submit", "arguments": {"answer": rng.choice(t["options"])}})]


def transcript(tokenizer: Any, system: str, tools: list[dict[str, Any]], turn: Turn) -> tuple[list[int], list[int]]:
    """The prompt the gateway renders for the turn's conversation, and the call as the model should write it."""
    conversation, call = turn
    messages = [{"role": "system", "content": system}, *conversation]
    text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    prompt = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    target = tokenizer(f"<tool_call>\n{json.dumps(call)}\n</tool_call>", add_special_tokens=False)["input_ids"]
    return prompt, [*target, tokenizer.convert_tokens_to_ids(tokenizer.eos_token)]


def warm_start(model_dir: Path, out: Path, system: str, tools: list[dict[str, Any]], steps: int = 150,
               batch: int = 16, lr: float = 1e-3, seed: int = 0,
               on_step: Callable[[int, float], None] | None = None,
               turns: Turns = letter_turns) -> tuple[Path, list[float], float]:
    """Train on the format, one turn of a fresh episode per example; returns the saved model, the loss per step
    and the seconds it took."""
    rng = random.Random(seed)

    def batch_of(tokenizer: Any) -> Batch:
        examples = []
        for _ in range(batch):
            episode = turns(rng)
            examples.append(transcript(tokenizer, system, tools,
                                       episode[0] if len(episode) == 1 else rng.choice(episode)))
        length = max(len(p) + len(c) for p, c in examples)
        ids = torch.full((batch, length), tokenizer.pad_token_id or 0)
        labels = torch.full((batch, length), -100)
        mask = torch.zeros(batch, length, dtype=torch.long)
        for i, (prompt, completion) in enumerate(examples):
            seq = prompt + completion
            ids[i, :len(seq)] = torch.tensor(seq)
            labels[i, len(prompt):len(seq)] = torch.tensor(completion)
            mask[i, :len(seq)] = 1
        return ids, labels, mask

    return fit(model_dir, out, steps, lr, seed, batch_of, on_step)
