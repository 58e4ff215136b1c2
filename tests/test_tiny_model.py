"""The project's own tiny model: Hugging Face format, deterministic, with a tool-calling chat template."""

from __future__ import annotations

import filecmp
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer


def test_same_seed_gives_byte_identical_files(tiny_model: Path, tmp_path: Path) -> None:
    again = tmp_path / "again"
    done = subprocess.run([sys.executable, "-m", "tether.cli", "model", "init-tiny", "--out", str(again),
                           "--seed", "0"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    names = sorted(p.name for p in tiny_model.iterdir())
    assert names == sorted(p.name for p in again.iterdir())
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(names)
    _, mismatch, errors = filecmp.cmpfiles(tiny_model, again, names, shallow=False)
    assert (mismatch, errors) == ([], [])


def test_a_standard_small_architecture(tiny_model: Path) -> None:
    config = AutoConfig.from_pretrained(tiny_model)
    assert config.model_type == "qwen2"
    assert 64 <= config.hidden_size <= 256 and config.num_hidden_layers <= 8
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    logits = model(torch.tensor([[1, 2, 3]])).logits
    assert logits.shape == (1, 3, config.vocab_size)


def test_chat_template_renders_every_role_and_tools(tiny_model: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    parameters = {"type": "object", "properties": {"q": {"type": "string"}}}
    tools: list[dict[Any, Any] | Callable[..., Any]] = [
        {"type": "function", "function": {"name": "lookup", "description": "Find a fact.", "parameters": parameters}}
    ]
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "France"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "Paris"},
        {"role": "assistant", "content": "Paris."},
    ]
    text = str(tokenizer.apply_chat_template(messages, tools=tools, tokenize=False))
    assert text.startswith("<|im_start|>system\nYou are terse.")
    assert json.dumps(tools[0]) in text
    assert '<tool_call>\n{"name": "lookup", "arguments": {"q": "France"}}\n</tool_call><|im_end|>' in text
    assert "<|im_start|>user\n<tool_response>\nParis\n</tool_response><|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\nParis.<|im_end|>\n")
    prompt = str(tokenizer.apply_chat_template(messages[:2], tokenize=False, add_generation_prompt=True))
    assert prompt.endswith("<|im_start|>assistant\n") and "# Tools" not in prompt


def test_format_tokens_are_single_tokens_that_decode_to_text(tiny_model: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    for token in ("<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"):
        ids = tokenizer(token, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1, token
    call = '<tool_call>\n{"name": "submit", "arguments": {"answer": "B"}}\n</tool_call>'
    ids = tokenizer(call, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids, skip_special_tokens=True) == call
    assert tokenizer.eos_token == "<|im_end|>"
