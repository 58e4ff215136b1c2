"""FakeVLLM: answers vLLM's /v1/completions at once with scripted replies, in vLLM's wire format.

It stands in for an inference engine where the point is not the model: the
gateway's own overhead (bench/gateway_overhead.py) and replies a tiny random
model would never write, such as a well-formed tool call. Replies are taken
in turn from the script; each comes back as token ids (tokenised with the
real tokenizer, ending with its end-of-turn token) with logprobs of -0.5.
Which reply: the k-th, where k is the number of tool results already in the
prompt (the last reply once the script runs out), so an agent loop of
"call a tool, then answer" is scripted by two replies.

    python -m tests.fakes.vllm --tokenizer DIR --port 8200 --reply "..." [--reply "..."]
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from transformers import AutoTokenizer

MODEL = "fake-vllm"


def tool_call(name: str, arguments: dict[str, Any]) -> str:
    """A scripted reply calling a tool, as the tiny model's chat format writes one (Hermes `<tool_call>` JSON)."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def create_app(tokenizer_dir: str, replies: list[str]) -> FastAPI:
    """The scripted replies: the k-th where k tool results are in the prompt (the last once they run out)."""
    app = FastAPI()

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "fake"}]}

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    tool_results: list[int] = []

    def scripted(prompt: list[int]) -> str:
        return replies[min(prompt.count(tool_results[0]), len(replies) - 1)]

    tokenizer = add_completions(app, tokenizer_dir, scripted)
    tool_results.append(int(tokenizer.convert_tokens_to_ids("<tool_response>")))
    add_chat(app, tokenizer, scripted)
    return app


def add_chat(app: FastAPI, tokenizer: Any, reply: Callable[[list[int]], str]) -> None:
    """vLLM's /v1/chat/completions on `app`, for gateways that forward chat calls as they are (the peer gateway
    of bench/peer_gateway.py): the messages rendered with the model's template, `reply(prompt)` as the assistant's
    text, and with `return_token_ids` the prompt's ids at the top and each choice's `token_ids` (vLLM >= 0.10.2),
    with `logprobs` each token's (-0.5). Streams one chunk of text, then the finish."""
    end = int(tokenizer.convert_tokens_to_ids(tokenizer.eos_token))

    @functools.lru_cache(maxsize=64)
    def render(messages: str) -> tuple[list[int], str, list[int]]:
        prompt = list(tokenizer.apply_chat_template(json.loads(messages), tokenize=True, add_generation_prompt=True,
                                                    return_dict=True)["input_ids"])
        text = reply(prompt)
        return prompt, text, [*tokenizer(text, add_special_tokens=False)["input_ids"], end]

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(request: Request) -> JSONResponse | StreamingResponse:
        body: dict[str, Any] = json.loads(await request.body())
        prompt, text, ids = render(json.dumps(body["messages"]))
        ids = ids[: body.get("max_tokens") or body.get("max_completion_tokens") or len(ids)]
        extra = {"token_ids": ids} if body.get("return_token_ids") else {}
        logprobs = ({"content": [{"token": tokenizer.decode([t]), "logprob": -0.5, "bytes": None, "top_logprobs": []}
                                 for t in ids]} if body.get("logprobs") else None)
        head = {"id": f"chatcmpl-{time.monotonic_ns()}", "created": int(time.time()), "model": MODEL,
                **({"prompt_token_ids": prompt} if body.get("return_token_ids") else {})}
        if not body.get("stream"):
            return JSONResponse({**head, "object": "chat.completion", "choices": [{
                "index": 0, "message": {"role": "assistant", "content": text, "tool_calls": []},
                "logprobs": logprobs, "finish_reason": "stop", "stop_reason": None, **extra}],
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids),
                          "total_tokens": len(prompt) + len(ids)}})

        async def events() -> AsyncIterator[str]:
            chunk = {**head, "object": "chat.completion.chunk"}
            for choice in ({"index": 0, "delta": {"role": "assistant", "content": text}, "logprobs": logprobs,
                            "finish_reason": None, **extra}, {"index": 0, "delta": {}, "finish_reason": "stop"}):
                yield f"data: {json.dumps({**chunk, 'choices': [choice]})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")


def add_completions(app: FastAPI, tokenizer_dir: str, reply: Callable[[list[int]], str],
                    stop_key: str = "stop_reason", answer: Callable[[dict[str, Any]], str] | None = None) -> Any:
    """vLLM's /v1/completions on `app`, answering each token-id prompt with `reply(prompt)` at once (its token
    ids, ending with the end-of-turn token, each with logprob -0.5); the tokenizer, for the caller's own use.
    As vLLM does, the ids come back as `token_ids` (and the prompt's as `prompt_token_ids`) only when asked
    `return_token_ids`, and the logprobs name each token "token_id:N" when asked `return_tokens_as_token_ids`.
    SGLang's answer to `return_token_ids` has the same choice fields but `matched_stop` for `stop_key`.
    `answer(body)`, where given, answers instead, from the whole request (the model or adapter it names); a
    LookupError it raises is answered 404 in the OpenAI envelope, as an unknown model is."""
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    end = int(tokenizer.convert_tokens_to_ids(tokenizer.eos_token))  # type: ignore[arg-type]

    @functools.lru_cache(maxsize=64)  # at once means at once: the benches time the gateway, not this tokenizer
    def encode(text: str) -> list[int]:
        return [*tokenizer(text, add_special_tokens=False)["input_ids"], end]

    @app.post("/v1/completions", response_model=None)
    async def completions(request: Request) -> JSONResponse | StreamingResponse:
        body: dict[str, Any] = json.loads(await request.body())
        prompt: list[int] = body["prompt"]
        choices: list[dict[str, Any]] = []
        try:
            turn = encode(answer(body) if answer is not None else reply(prompt))
        except LookupError as exc:
            message = str(exc.args[0]) if exc.args else str(exc)
            return JSONResponse({"error": {"message": message, "type": "NotFoundError", "param": "model",
                                           "code": 404}}, status_code=404)
        with_ids = bool(body.get("return_token_ids"))  # vLLM >= 0.10.2: the prompt's ids too
        as_ids = bool(body.get("return_tokens_as_token_ids"))  # the logprobs' tokens named "token_id:N"
        for index in range(body.get("n") or 1):
            ids = turn[: body.get("max_tokens") or len(turn)]
            tokens = [f"token_id:{t}" if as_ids else tokenizer.decode([t]) for t in ids]
            choice = {"index": index, "text": tokenizer.decode(ids, skip_special_tokens=True),
                      "logprobs": {"tokens": tokens, "token_logprobs": [-0.5] * len(ids),
                                   "top_logprobs": [{} for _ in ids], "text_offset": []}
                      if body.get("logprobs") is not None else None,
                      "finish_reason": "stop", stop_key: None}
            choices.append({**choice, "token_ids": ids} if with_ids else choice)
        head = {"id": f"cmpl-{time.monotonic_ns()}", "object": "text_completion", "created": int(time.time()),
                "model": MODEL}
        completion_tokens = len(turn[: body.get("max_tokens") or len(turn)]) * len(choices)
        if not body.get("stream"):
            for c in choices:
                if with_ids:
                    c["prompt_token_ids"] = prompt
            usage = {"prompt_tokens": len(prompt), "completion_tokens": completion_tokens}
            return JSONResponse({**head, "choices": choices, "usage": usage})

        async def events() -> AsyncIterator[str]:
            for c in choices:  # one chunk per choice: text and ids at once, the prompt's with its first
                chunk = {**c, "prompt_token_ids": prompt} if with_ids else c
                yield f"data: {json.dumps({**head, 'choices': [chunk]})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--reply", action="append", required=True)
    args = parser.parse_args()
    uvicorn.run(create_app(args.tokenizer, args.reply), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
