"""Errors of the gateway; each knows its HTTP status and how OpenAI and Anthropic clients expect to see it.

    GatewayError
    ├── InvalidRequest      400  a field is malformed, out of range or unsupported
    ├── Unauthorized        401  no key, or a key that is neither a rollout token nor the admin key
    ├── Forbidden           403  a rollout token used for another rollout
    ├── RolloutNotFound     404  the rollout was never registered
    ├── RolloutSealed       409  the rollout is sealed: its record is closed
    ├── InternalError       500  a bug or an unforeseen failure inside the gateway (recorded all the same)
    ├── EngineFailed        502  the inference engine failed or answered with an error
    └── Unavailable         503  the call was not served; Retry-After says when to try again
        ├── RecordingFailed      Kafka did not acknowledge the call's event
        └── HeldTooLong          held during a weight update past the configured bound
"""

from __future__ import annotations

from typing import Any

_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 409: "invalid_request_error", 413: "request_too_large",
                    502: "api_error", 503: "overloaded_error"}
_OPENAI_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                 404: "not_found_error", 409: "conflict_error", 413: "invalid_request_error", 502: "server_error",
                 503: "service_unavailable"}


class GatewayError(Exception):
    status = 500

    def __init__(self, message: str, param: str | None = None, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.retry_after_s = retry_after_s

    def openai_body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": _OPENAI_TYPES.get(self.status, "server_error"),
                          "param": self.param, "code": self.status}}

    def anthropic_body(self) -> dict[str, Any]:
        return {"type": "error", "error": {"type": _ANTHROPIC_TYPES.get(self.status, "api_error"),
                                           "message": self.message}}

    def headers(self) -> dict[str, str]:
        return {"retry-after": str(max(1, round(self.retry_after_s)))} if self.retry_after_s is not None else {}


class InvalidRequest(GatewayError):
    status = 400


class BodyTooLarge(InvalidRequest):
    status = 413


class Unauthorized(GatewayError):
    status = 401


class Forbidden(GatewayError):
    status = 403


class RolloutNotFound(GatewayError):
    status = 404


class RolloutSealed(GatewayError):
    status = 409


class InternalError(GatewayError):
    status = 500


class EngineFailed(GatewayError):
    status = 502


class Unavailable(GatewayError):
    status = 503


class RecordingFailed(Unavailable):
    pass


class HeldTooLong(Unavailable):
    pass
