"""OpenAI `POST /v1/responses`: generations → a response or the Responses event stream.

The stream is the API's full sequence, each event numbered: created and
in_progress, the message item with its text part and deltas, each function
call with its arguments, the items done, then completed (or incomplete when
the token limit cut it, or failed). Nothing terminal leaves before the call
is recorded.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from gateway.api.responses.protocol import (
    FunctionCallItem,
    OutputMessage,
    OutputText,
    Response,
    ResponsesRequest,
    Usage,
)
from gateway.chat import Finished, Generation, Started, TokenUsage
from gateway.choices import Delta
from gateway.errors import GatewayError


class Responder:
    def __init__(self, request: ResponsesRequest) -> None:
        self.request = request
        self.id = f"resp_{uuid.uuid4().hex}"
        self.message_id = f"msg_{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.namespaces = request.namespaces()
        self._seq = 0

    def rename(self, name: str) -> str:
        self.id, self.message_id = f"resp_{name[:32]}", f"msg_{name[32:]}"
        return self.id

    def _response(self, status: str, output: list[OutputMessage | FunctionCallItem], usage: Usage | None = None,
                  **extra: Any) -> Response:
        r = self.request
        return Response(id=self.id, created_at=self.created, status=status, model=r.model, output=output, usage=usage,
                        instructions=r.instructions, max_output_tokens=r.max_output_tokens,
                        parallel_tool_calls=r.parallel_tool_calls, previous_response_id=r.previous_response_id,
                        temperature=r.temperature, top_p=r.top_p, tool_choice=r.tool_choice, tools=r.tools or [],
                        store=r.store, metadata=r.metadata or {}, reasoning=r.reasoning, **extra)

    def _output(self, g: Generation) -> list[OutputMessage | FunctionCallItem]:
        items: list[OutputMessage | FunctionCallItem] = []
        if g.content or not g.tool_calls:
            items.append(OutputMessage(id=self.message_id, status=_status(g), content=[OutputText(text=g.content)]))
        items += [FunctionCallItem(id=f"fc_{c.id.removeprefix('call_')}", call_id=c.id, name=c.name,
                                   arguments=c.arguments, namespace=self.namespaces.get(c.name))
                  for c in g.tool_calls]
        return items

    def body(self, generations: list[Generation], usage: TokenUsage, version: int) -> Response:
        (g,) = generations
        incomplete = {"reason": "max_output_tokens"} if g.finish_reason == "length" else None
        return self._response(_status(g), self._output(g), Usage.of(usage), incomplete_details=incomplete)

    def _event(self, kind: str, **data: Any) -> str:
        self._seq += 1
        return f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': self._seq, **data})}\n\n"

    def _text_opened(self) -> list[str]:
        item = OutputMessage(id=self.message_id, status="in_progress", content=[])
        return [self._event("response.output_item.added", output_index=0, item=item.model_dump()),
                self._event("response.content_part.added", item_id=self.message_id, output_index=0, content_index=0,
                            part=OutputText(text="").model_dump())]

    def _finish(self, item: Finished, text_open: bool) -> list[str]:
        """The message closed, each function call whole, then the response as it stands."""
        events: list[str] = []
        response = self.body(item.generations, item.usage, item.weight_version)
        for index, out in enumerate(response.output):
            if isinstance(out, OutputMessage):
                if not text_open:
                    events += self._text_opened()
                part = out.content[0]
                events += [
                    self._event("response.output_text.done", item_id=out.id, output_index=index, content_index=0,
                                text=part.text, logprobs=[]),
                    self._event("response.content_part.done", item_id=out.id, output_index=index, content_index=0,
                                part=part.model_dump()),
                ]
            else:
                events += [
                    self._event("response.output_item.added", output_index=index,
                                item={**out.model_dump(), "arguments": "", "status": "in_progress"}),
                    self._event("response.function_call_arguments.delta", item_id=out.id, output_index=index,
                                delta=out.arguments),
                    self._event("response.function_call_arguments.done", item_id=out.id, output_index=index,
                                name=out.name, arguments=out.arguments),
                ]
            events.append(self._event("response.output_item.done", output_index=index, item=out.model_dump()))
        kind = "response.incomplete" if response.status == "incomplete" else "response.completed"
        events.append(self._event(kind, response=response.model_dump()))
        return events

    async def sse(self, items: AsyncIterator[Started | Delta | Finished]) -> AsyncIterator[str]:
        text_open = False
        try:
            async for item in items:
                if isinstance(item, Started):
                    opening = self._response("in_progress", []).model_dump()
                    yield self._event("response.created", response=opening)
                    yield self._event("response.in_progress", response=opening)
                elif isinstance(item, Delta):
                    if not text_open:
                        for event in self._text_opened():
                            yield event
                        text_open = True
                    yield self._event("response.output_text.delta", item_id=self.message_id, output_index=0,
                                      content_index=0, delta=item.text, logprobs=[])
                else:
                    for event in self._finish(item, text_open):
                        yield event
        except GatewayError as exc:
            error = {"code": exc.openai_type, "message": exc.message}
            yield self._event("response.failed", response=self._response("failed", [], error=error).model_dump())


def _status(g: Generation) -> str:
    return "incomplete" if g.finish_reason == "length" else "completed"
