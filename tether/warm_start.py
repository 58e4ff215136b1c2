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
NOT_SCORED = -100
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


def episode_row(tokenizer: Any, system: str, tools: list[dict[str, Any]], episode: list[Turn]
                ) -> tuple[list[int], list[int]]:
    """The whole episode in one sequence (the last turn's prompt holds the earlier calls, rendered by the chat
    template), each call it makes scored where it stands: an episode of three calls teaches three calls for the
    price of one forward pass, and the model learns each turn in the context it will meet it in."""
    prompt, call = transcript(tokenizer, system, tools, episode[-1])
    tokens = prompt + call
    labels = [NOT_SCORED] * len(prompt) + call
    for turn in episode[:-1]:
        before, earlier = transcript(tokenizer, system, tools, turn)
        if tokens[len(before):len(before) + len(earlier)] != earlier:
            raise ValueError(f"the chat template renders an earlier call otherwise than the model writes it: "
                             f"{tokenizer.decode(tokens[len(before):len(before) + len(earlier)])!r} against "
                             f"{tokenizer.decode(earlier)!r}")
        labels[len(before):len(before) + len(earlier)] = earlier
    return tokens, labels


def warm_start(model_dir: Path, out: Path, system: str, tools: list[dict[str, Any]], steps: int = 150,
               batch: int = 16, lr: float = 1e-3, seed: int = 0,
               on_step: Callable[[int, float], None] | None = None,
               turns: Turns = letter_turns) -> tuple[Path, list[float], float]:
    """Train on the format, a fresh episode per example with every call of it scored; returns the saved model,
    the loss per step and the seconds it took."""
    rng = random.Random(seed)

    def batch_of(tokenizer: Any) -> Batch:
        rows = [episode_row(tokenizer, system, tools, turns(rng)) for _ in range(batch)]
        length = max(len(tokens) for tokens, _ in rows)
        ids = torch.full((batch, length), tokenizer.pad_token_id or 0)
        labels = torch.full((batch, length), NOT_SCORED)
        mask = torch.zeros(batch, length, dtype=torch.long)
        for i, (tokens, scored) in enumerate(rows):
            ids[i, :len(tokens)] = torch.tensor(tokens)
            labels[i, :len(tokens)] = torch.tensor(scored)
            mask[i, :len(tokens)] = 1
        return ids, labels, mask

    return fit(model_dir, out, steps, lr, seed, batch_of, on_step)
