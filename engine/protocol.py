"""vLLM's `/v1/completions` wire format: the request we accept and the bodies and chunks we send.

Field names and shapes follow vLLM's OpenAI-compatible server (including
`return_token_ids`, `stop_token_ids`, `ignore_eos`, `stop_reason`), so a
client cannot tell this engine from vLLM. Tether adds `weight_version`.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from engine.errors import InvalidRequest
from engine.sampling import SamplingParams
from engine.sequences import Chunk, Request

TokenId = Annotated[StrictInt, Field(ge=0)]


class StreamOptions(BaseModel):
    include_usage: bool = False


class CompletionRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    prompt: str | list[Any]
    max_tokens: int | None = Field(16, ge=1)
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    n: int = Field(1, ge=1, le=64)
    stop: str | list[str] | None = None
    stop_token_ids: list[TokenId] | None = None
    seed: int | None = None
    logprobs: int | None = Field(None, ge=0)
    echo: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    return_token_ids: bool = False
    #: with `logprobs`, each token named "token_id:N" instead of its text (vLLM's flag): a client reads the ids
    #: from the logprobs, and the answer need not carry the prompt's ids back (`return_token_ids` does)
    return_tokens_as_token_ids: bool = False
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    user: str | None = None

    def prompt_ids(self, encode: Any) -> list[int]:
        """The single prompt as token ids; batched prompts are refused (send one request per prompt)."""
        prompt: Any = self.prompt
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, str):
            return list(encode(prompt))
        if prompt and all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
            if any(p < 0 for p in prompt):
                raise InvalidRequest("prompt: token ids must be non-negative", "prompt")
            return list(prompt)
        raise InvalidRequest("prompt must be one string or one non-empty list of token ids; send one request per "
                             "prompt", "prompt")

    def to_engine(self, prompt_ids: list[int], max_logprobs: int, room: int,
                  default_max_tokens: int | None = None) -> Request:
        if self.echo:
            raise InvalidRequest("echo is not supported", "echo")
        if self.presence_penalty or self.frequency_penalty:
            raise InvalidRequest("presence_penalty and frequency_penalty are not supported", "presence_penalty")
        if self.logprobs is not None and self.logprobs > max_logprobs:
            raise InvalidRequest(f"logprobs must be at most {max_logprobs}", "logprobs")
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return Request(
            prompt_ids=prompt_ids,
            max_tokens=self.max_tokens if self.max_tokens is not None else max(1, min(
                room - len(prompt_ids), default_max_tokens or room)),
            n=self.n,
            sampling=SamplingParams(temperature=self.temperature, top_p=self.top_p, seed=self.seed,
                                    top_logprobs=self.logprobs or 0),
            stop=stop,
            stop_token_ids=list(self.stop_token_ids or []),
            ignore_eos=self.ignore_eos,
            stream=self.stream,
        )


def error_body(message: str, type_: str, code: int, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


class Choice:
    """One choice being assembled from its tokens."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.text = ""
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.tops: list[dict[str, float]] = []
        self.offsets: list[int] = []
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None

    def add(self, chunk: Chunk, name: Any) -> None:
        """`name`: how the top logprobs name a token (`Responder.name`)."""
        self.text += chunk.text
        self.token_ids += chunk.token_ids
        self.logprobs += chunk.logprobs
        self.tops += [{name(i): lp for i, lp in top} for top in chunk.tops]
        self.offsets += chunk.text_offsets
        self.finish_reason, self.stop_reason = chunk.finish_reason, chunk.stop_reason


def logprobs_block(name: Any, ids: list[int], lps: list[float], tops: list[dict[str, float]],
                   offsets: list[int]) -> dict[str, Any]:
    """OpenAI completions `logprobs`: tokens, token_logprobs, top_logprobs, text_offset; `name`: a token's text,
    or `token_id_name`."""
    return {"tokens": [name(i) for i in ids], "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


def token_id_name(token_id: int) -> str:
    """A token as vLLM names it under `return_tokens_as_token_ids`."""
    return f"token_id:{token_id}"


class Responder:
    """Builds vLLM-shaped bodies and stream chunks for one request."""

    def __init__(self, request: CompletionRequest, model: str, prompt_ids: list[int], decode: Any) -> None:
        self.request = request
        self.model = model
        self.prompt_ids = prompt_ids
        #: how the logprobs name a token: its text, or its id where the request asks for ids
        self.name = token_id_name if request.return_tokens_as_token_ids else decode
        self.id = f"cmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.version: int | None = None
        self.completion_tokens = 0

    def _choice(self, c: Choice, prompt_ids: bool) -> dict[str, Any]:
        body: dict[str, Any] = {
            "index": c.index, "text": c.text,
            "logprobs": logprobs_block(self.name, c.token_ids, c.logprobs, c.tops, c.offsets)
            if self.request.logprobs is not None else None,
            "finish_reason": c.finish_reason, "stop_reason": c.stop_reason,
        }
        if self.request.return_token_ids:
            if prompt_ids:
                body["prompt_token_ids"] = self.prompt_ids
            body["token_ids"] = c.token_ids
        return body

    def usage(self) -> dict[str, int]:
        p = len(self.prompt_ids)
        return {"prompt_tokens": p, "completion_tokens": self.completion_tokens,
                "total_tokens": p + self.completion_tokens}

    def body(self, choices: list[Choice]) -> dict[str, Any]:
        self.completion_tokens = sum(len(c.token_ids) for c in choices)
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                "choices": [self._choice(c, True) for c in sorted(choices, key=lambda c: c.index)],
                "usage": self.usage(), "weight_version": self.version}

    def chunk(self, chunk: Chunk, first: bool) -> dict[str, Any]:
        self.completion_tokens += len(chunk.token_ids)
        c = Choice(chunk.index)
        c.add(chunk, self.name)
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                "choices": [self._choice(c, first)], "weight_version": chunk.version}

    def usage_chunk(self) -> dict[str, Any]:
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                "choices": [], "usage": self.usage(), "weight_version": self.version}
