"""The model's tokenizer and chat template, read straight from its files.

The gateway needs only encode, decode and the chat template, not transformers:
importing transformers pulls in torch, which costs the gateway ~600 MB of
resident memory and seconds of start-up. The template environment matches
transformers' `apply_chat_template` (sandboxed, trim/lstrip blocks,
loopcontrols, its `tojson`, `raise_exception`, `strftime_now`); a test checks
the two render alike.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.meta
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from gateway.pieces import PieceCache


def _raise(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


#: within `ChatTokenizer.same_inputs`: what `tojson` wrote, by the object and its options
_written: ContextVar[dict[tuple[Any, ...], tuple[Any, str]] | None] = ContextVar("_written", default=None)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    written = _written.get()
    key = (id(x), ensure_ascii, indent, separators, sort_keys)
    if written is not None and (hit := written.get(key)) is not None and hit[0] is x:
        return hit[1]
    text = json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    if written is not None:
        written[key] = (x, text)  # x is held: its id cannot be another object's while this lasts
    return text


def _token_text(value: Any) -> str | None:
    """A special token in tokenizer_config.json: a string or an AddedToken dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


class ChatTokenizer:
    def __init__(self, tokenizer: Tokenizer, chat_template: str, special_tokens: dict[str, str],
                 cache_tokens: int = 0) -> None:
        if "eos_token" not in special_tokens:
            raise ValueError("the tokenizer has no eos_token")
        self.backend = tokenizer
        self.special_tokens = special_tokens
        self.eos_token = special_tokens["eos_token"]
        eos_id = tokenizer.token_to_id(self.eos_token)
        if eos_id is None:
            raise ValueError(f"the eos_token {self.eos_token!r} is not in the vocabulary")
        self.eos_token_id: int = eos_id
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals.update(raise_exception=_raise, strftime_now=lambda fmt: datetime.now().strftime(fmt))
        self._template = env.from_string(chat_template)
        #: the text depends on the inputs alone (no clock): the same conversation always renders the same
        self.timeless = "strftime_now" not in jinja2.meta.find_undeclared_variables(env.parse(chat_template))
        self.pieces = PieceCache(tokenizer, cache_tokens)

    @classmethod
    def load(cls, directory: Path, cache_tokens: int = 0) -> ChatTokenizer:
        """A Hugging Face model directory: tokenizer.json, tokenizer_config.json, chat_template.jinja (optional).
        `cache_tokens`: ids of long pieces remembered (gateway.pieces)."""
        config: dict[str, Any] = json.loads((directory / "tokenizer_config.json").read_text())
        template = config.get("chat_template")
        if isinstance(template, list):  # named templates: the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        if (directory / "chat_template.jinja").exists():
            template = (directory / "chat_template.jinja").read_text()
        if not isinstance(template, str):
            raise ValueError(f"{directory} has no chat template")
        special = {k: text for k, v in config.items() if k.endswith("_token") and (text := _token_text(v))}
        return cls(Tokenizer.from_file(str(directory / "tokenizer.json")), template, special, cache_tokens)

    def apply_chat_template(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                            add_generation_prompt: bool) -> str:
        return self._template.render(messages=messages, tools=tools, documents=None,
                                     add_generation_prompt=add_generation_prompt, **self.special_tokens)

    @contextmanager
    def same_inputs(self) -> Iterator[None]:
        """Renderings of the same objects inside: `tojson` writes each once (a rollout's tools, in every rendering
        of a call). The sandbox is immutable, so no template can change what was written."""
        token = _written.set({})
        try:
            yield
        finally:
            _written.reset(token)

    def encode(self, text: str) -> list[int]:
        return self.pieces.encode(text)

    def encode_whole(self, text: str) -> list[int]:
        """The tokenizer's own, in one go (what `encode` equals)."""
        return list(self.backend.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return str(self.backend.decode(ids, skip_special_tokens=skip_special_tokens))
