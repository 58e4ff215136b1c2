"""A tiny Qwen2 model and byte-level BPE tokenizer, built deterministically from a seed.

No weights can be downloaded where Tether is developed and tested, so the
project makes its own: the same files a real Hugging Face model has (config,
safetensors, tokenizer.json, chat template), so the loading code that takes
this directory takes `Qwen/Qwen2.5-0.5B-Instruct` unchanged.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

CHAT_TEMPLATE = (Path(__file__).parent / "chat_template.jinja").read_text()
ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL = [ENDOFTEXT, IM_START, IM_END]
# Not special: they decode to text, so a parser sees them in the completion.
FORMAT_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<tools>", "</tools>"]

WORDS = (  # noqa: SIM905 (a sentence reads better than a list of 80 strings)
    "the a an of to in is it that for on with as was by at be this from or are which not have has had but what all "
    "were when we there can one will would your if their do so out up about then them these may into could time "
    "file line error test function value return list answer question tool call result number letter option pick "
    "task agent search lookup submit read write run check find open close start stop done yes no true false none "
    "python code def class import print self data key name item count total sum add sub max min first last next"
).split()
TOOLS = ["lookup", "submit", "search", "read_file", "run_tests", "calculator"]


def corpus(seed: int, n_docs: int = 3000) -> list[str]:
    """Chat transcripts, tool calls, JSON, code and arithmetic: what the tokenizer should compress well."""
    rng = random.Random(seed)

    def sentence(n: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + rng.choice([".", "?", "!", ":"])

    docs = []
    for _ in range(n_docs):
        kind = rng.randrange(5)
        if kind == 0:
            args = {rng.choice(WORDS): rng.choice([rng.randrange(1000), sentence(3), rng.choice("ABCD")])}
            call = json.dumps({"name": rng.choice(TOOLS), "arguments": args})
            docs.append(f"{IM_START}user\n{sentence(12)}{IM_END}\n{IM_START}assistant\n<tool_call>\n{call}\n"
                        f"</tool_call>{IM_END}\n{IM_START}user\n<tool_response>\n{sentence(6)}\n</tool_response>"
                        f"{IM_END}\n")
        elif kind == 1:
            a, b = rng.randrange(1000), rng.randrange(1000)
            docs.append(f"{IM_START}user\nWhat is {a} + {b}?{IM_END}\n{IM_START}assistant\n{a + b}{IM_END}\n")
        elif kind == 2:
            letters = rng.sample("ABCDEFGH", 4)
            docs.append(f"{IM_START}system\n{sentence(8)}{IM_END}\n{IM_START}user\nPick one of "
                        f"{', '.join(letters)}.{IM_END}\n{IM_START}assistant\n{rng.choice(letters)}{IM_END}\n")
        elif kind == 3:
            name, arg = rng.choice(WORDS), rng.choice(WORDS)
            docs.append(f"def {name}_{rng.randrange(99)}({arg}):\n    return {arg} + {rng.randrange(10)}\n")
        else:
            docs.append(" ".join(sentence(rng.randrange(4, 16)) for _ in range(rng.randrange(1, 5))))
    return docs


def build_tokenizer(seed: int, vocab_size: int) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    # What transformers' Qwen2Tokenizer installs when it loads a qwen2 model, so that tokenizer.json alone
    # (the gateway reads only that) encodes exactly as the engine and trainer do.
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(seed), trainer=trainer)
    tok.add_tokens(FORMAT_TOKENS)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=IM_END, pad_token=ENDOFTEXT, unk_token=None, bos_token=None,
        model_max_length=4096, clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_model(seed: int, vocab_size: int, eos_ids: list[int], pad_id: int, hidden: int = 128,
                layers: int = 4, context: int = 4096) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=hidden * 3, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=context, tie_word_embeddings=True,
        bos_token_id=None, eos_token_id=eos_ids[0], pad_token_id=pad_id,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=eos_ids, pad_token_id=pad_id)
    return model


def init_tiny(out: Path, seed: int = 0, vocab_size: int = 2048, hidden: int = 128, layers: int = 4,
              context: int = 4096) -> Path:
    """Write the tokenizer and a randomly initialised model to `out`; the same seed gives the same bytes.
    `context`: the longest prompt and answer it takes (rotary positions need no weights, so only the config
    changes); real harnesses such as Claude Code send prompts of 20-30 thousand of its tokens."""
    tokenizer = build_tokenizer(seed, vocab_size)
    im_end, endoftext = (int(tokenizer.convert_tokens_to_ids(t)) for t in (IM_END, ENDOFTEXT))  # type: ignore[arg-type]
    model = build_model(seed, len(tokenizer), [im_end, endoftext], endoftext, hidden, layers, context)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out)
    model.save_pretrained(out)
    return out
