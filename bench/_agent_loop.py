"""The demo agent's loop in one process, for benchmarks that train for many updates (`bench/ablation.py`).

The stack (gateway, Kafka, processors) is what `tether demo` runs; a bench that
compares twelve training runs within the hour cannot pay its start and its
per-call cost twelve times, so this runs the same episode in-process:

    the agent's own tool semantics (`act` of examples/openai_agent.py), its
    system prompt and tools, the model's chat template, the gateway's tool-call
    parser, a prompt that grows by the exact tokens the model produced (as the
    gateway reuses its own turns), and the processors' sample assembly
    (`stream_processors.assembly`) into the TaskGroups the trainer takes.

What it leaves out is the transport, not the learning problem.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from gateway.tool_parsers import HermesParser
from schemas.events import RolloutSample, TaskGroup
from stream_processors.assembly import Call, assemble
from tether.modules import load_file

ROOT = Path(__file__).parent.parent


AGENT = load_file(ROOT / "examples" / "openai_agent.py")
TASK = load_file(ROOT / "examples" / "lookup_task.py")


@dataclass
class Episode:
    """One rollout in progress: its task, its prompt so far, its calls, and its reward once it ends."""
    task: dict[str, Any]
    prompt: list[int]
    calls: list[Call] = field(default_factory=list)
    reward: float | None = None


class Agents:
    """Runs episodes of the demo agent against a model held here, many at once (one batched forward per token)."""

    def __init__(self, model: Any, tokenizer: Any, max_turns: int, max_tokens: int = 40) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.max_turns, self.max_tokens = max_turns, max_tokens
        self.parser = HermesParser()
        self.eos = [tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
        self.pad = tokenizer.convert_tokens_to_ids("<|endoftext|>")

    @property
    def device(self) -> torch.device:
        """Where the model is: rollouts run there (CPU here; a GPU where there is one)."""
        device: torch.device = next(self.model.parameters()).device
        return device

    def first_prompt(self, task: dict[str, Any]) -> list[int]:
        messages = [{"role": "system", "content": AGENT.SYSTEM}, {"role": "user", "content": task["question"]}]
        text = self.tokenizer.apply_chat_template(messages, tools=AGENT.TOOLS, tokenize=False,
                                                  add_generation_prompt=True)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _tail(self, text: str) -> list[int]:
        """What the chat template puts after the model's own turn: a user turn, then the next assistant turn."""
        return list(self.tokenizer(f"\n<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n",
                                   add_special_tokens=False)["input_ids"])

    def run(self, tasks: list[dict[str, Any]], temperature: float, version: int, seed: int) -> list[Episode]:
        """Each task's episode to its end: a submission, a malformed or unknown call, or `max_turns` calls."""
        episodes = [Episode(t, self.first_prompt(t)) for t in tasks]
        generator = torch.Generator(self.device).manual_seed(seed)
        for seq in range(self.max_turns):
            live = [e for e in episodes if e.reward is None]
            if not live:
                break
            for e, (tokens, logprobs) in zip(live, self._generate([e.prompt for e in live], temperature, generator),
                                             strict=True):
                e.calls.append(Call(f"c{seq}", seq, 0, list(e.prompt), tokens, logprobs, version))
                self._step(e, tokens)
        for e in episodes:
            e.reward = 0.0 if e.reward is None else e.reward  # out of turns
        return episodes

    def _step(self, e: Episode, tokens: list[int]) -> None:
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        _, calls = self.parser.parse(text)
        ended = tokens + ([] if tokens and tokens[-1] in self.eos else [self.eos[0]])  # as the template closes it
        if not calls:  # the agent asks for a tool and goes on
            e.prompt = e.prompt + ended + self._tail("Use a tool.")
            return
        outputs = []
        for call in calls:
            reward, answer = AGENT.act(e.task, call.name, json.loads(call.arguments))
            if reward is not None:
                e.reward = reward
                return
            outputs.append(f"<tool_response>\n{answer}\n</tool_response>")
        e.prompt = e.prompt + ended + self._tail("\n".join(outputs))

    @torch.no_grad()
    def _generate(self, prompts: list[list[int]], temperature: float, generator: torch.Generator
                  ) -> list[tuple[list[int], list[float]]]:
        """Left-padded batch decoding with a KV cache; each token's log-probability under the sampling
        distribution (temperature 1: the policy's own)."""
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad)
        mask = torch.zeros(len(prompts), width, dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(p)
            mask[i, width - len(p):] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out: list[list[int]] = [[] for _ in prompts]
        logps: list[list[float]] = [[] for _ in prompts]
        done = [False] * len(prompts)
        past = None
        step_ids, step_pos = ids, positions
        for _ in range(self.max_tokens):
            result = self.model(input_ids=step_ids, attention_mask=mask, position_ids=step_pos, past_key_values=past,
                                use_cache=True)
            past = result.past_key_values
            logits = result.logits[:, -1, :].float()
            if temperature > 0:
                logp = torch.log_softmax(logits / temperature, -1)
                chosen = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(-1)
            else:
                logp = torch.log_softmax(logits, -1)
                chosen = logits.argmax(-1)
            picked = logp.gather(-1, chosen[:, None]).squeeze(-1)
            for i, (token, logprob) in enumerate(zip(chosen.tolist(), picked.tolist(), strict=True)):  # one sync
                if not done[i]:
                    out[i].append(token)
                    logps[i].append(logprob)
                    done[i] = token in self.eos
            if all(done):
                break
            step_ids = chosen[:, None]
            step_pos = step_pos[:, -1:] + 1
            mask = torch.cat([mask, mask.new_ones(len(prompts), 1)], dim=1)
        return list(zip(out, logps, strict=True))


def task_group(group_id: str, task: dict[str, Any], episodes: list[Episode]) -> TaskGroup:
    """The group the processors would emit: each rollout's calls assembled into segments."""
    rollouts = [RolloutSample(rollout_id=f"{group_id}.r{i}", reward=float(e.reward or 0.0), status="succeeded",
                              segments=assemble(e.calls)) for i, e in enumerate(episodes)]
    return TaskGroup(group_id=group_id, run_id="bench", task_id=str(task["id"]), group_size=len(episodes),
                     rollouts=rollouts)


def held_out(seed: int, n: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [TASK.task(rng, i) for i in range(n)]
