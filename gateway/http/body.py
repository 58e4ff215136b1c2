"""The body as sent, read and parsed by the gateway, not by FastAPI.

The size bound is enforced while a chunked upload arrives, the text is kept
exactly as sent for the record, and what no later step could take (NaN,
lone surrogates) is refused by field; a body that does not fit the API's
model is refused naming the first field at fault.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from gateway.errors import BodyTooLarge, InvalidRequest
from gateway.settings import GatewaySettings
from schemas.validation import first_error

Model = TypeVar("Model", bound=BaseModel)


async def read_body(request: Request, max_bytes: int) -> tuple[str, dict[str, Any]]:
    """The body as the harness sent it (kept for the record) and parsed."""
    declared = int(request.headers.get("content-length") or 0)
    if declared > max_bytes:
        raise BodyTooLarge(f"request body over {max_bytes} bytes")
    parts, size = [], 0
    async for part in request.stream():  # a chunked upload is capped as it arrives, not after
        size += len(part)
        if size > max_bytes:
            raise BodyTooLarge(f"request body over {max_bytes} bytes")
        parts.append(part)
    try:
        raw = b"".join(parts).decode()
        body = json.loads(raw, parse_constant=_not_json, parse_float=_finite)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise InvalidRequest(f"malformed JSON body: {exc}") from exc
    if not isinstance(body, dict):
        raise InvalidRequest("the body must be a JSON object")
    if _ESCAPED_SURROGATE.search(raw) and (field := lone_surrogate(body)) is not None:
        raise InvalidRequest(f"{field}: a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff escape) is not "
                             "text; send valid Unicode", field)
    return raw, body


def _not_json(constant: str) -> None:
    """NaN and Infinity: Python reads them, JSON has no such thing, and the record must stay JSON."""
    raise ValueError(f"{constant} is not a JSON value")


def _finite(number: str) -> float:
    """A number too large for a double (1e999) would be read as infinity: refused like Infinity itself."""
    value = float(number)
    if not math.isfinite(value):
        raise ValueError(f"{number[:20]} is out of range")
    return value


# A JSON escape in the surrogate range; the only way a lone surrogate gets in, since the bytes are strict UTF-8.
_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89abcdefABCDEF]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def lone_surrogate(body: Any) -> str | None:
    """The first field (a dotted path) whose name or text holds a lone surrogate, or None.

    No tokenizer, Avro encoder or JSON writer downstream can take one (the tokenizer's TypeError was a 500)."""
    stack: list[tuple[str, str, Any]] = [("", "", body)]  # (path, the key it is under, value)
    while stack:  # not recursive: json.loads accepts nesting deeper than the recursion limit leaves here
        path, key, value = stack.pop()
        if _SURROGATE.search(key) or (isinstance(value, str) and _SURROGATE.search(value)):
            return path.encode("utf-8", "backslashreplace").decode() or "body"  # a bad key is shown escaped
        if isinstance(value, dict):
            stack += [(f"{path}.{k}" if path else k, k, v) for k, v in reversed(value.items())]
        elif isinstance(value, list):
            stack += [(f"{path}.{i}" if path else str(i), "", v) for i, v in reversed(list(enumerate(value)))]
    return None


def parse(model: type[Model], body: dict[str, Any]) -> Model:
    """The body as `model`, or an InvalidRequest naming the first field at fault, as OpenAI words it."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        error = first_error(exc)
        if error.type == "extra_forbidden":
            error = replace(error, message="Unrecognized request argument supplied")
        raise InvalidRequest(error.line(), error.field) from exc


async def parse_body(request: Request, model: type[Model], settings: GatewaySettings) -> tuple[Model, str]:
    """Read and parse: the request as `model`, and its text as sent."""
    raw, body = await read_body(request, settings.max_body_bytes)
    return parse(model, body), raw
