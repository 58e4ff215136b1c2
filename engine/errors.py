"""Errors of the engine, each carrying the HTTP status and OpenAI error type it is answered with.

    EngineError
    ├── InvalidRequest    400 BadRequestError: a field is out of range, malformed or unsupported
    │   └── ContextOverflow  400: prompt (+ max_tokens) longer than the model's context
    ├── ModelNotFound     404 NotFoundError: the request names a model this engine does not serve
    └── EngineUnavailable 503 ServiceUnavailableError: stopped, or weights failed to load
"""

from __future__ import annotations


class EngineError(Exception):
    status = 500
    type = "InternalServerError"

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class InvalidRequest(EngineError):
    status = 400
    type = "BadRequestError"


class ContextOverflow(InvalidRequest):
    pass


class ModelNotFound(EngineError):
    status = 404
    type = "NotFoundError"


class EngineUnavailable(EngineError):
    status = 503
    type = "ServiceUnavailableError"
