"""Errors of the gateway; each knows its HTTP status and how OpenAI and Anthropic clients expect to see it.

    GatewayError                  500  the base: a bug unless a subclass says otherwise
    ├── InvalidRequest            400  a field is malformed, out of range or unsupported
    │   └── BodyTooLarge          413  the request body is over the configured bound
    ├── Unauthorized              401  no key, or a key that is neither a rollout token nor the admin key
    ├── Forbidden                 403  a rollout token used for another rollout
    ├── RolloutNotFound           404  neither this process nor the log knows the rollout
    ├── ResponseNotFound          404  no stored response has that id in the caller's rollout
    ├── RolloutAlreadySealed      409  the rollout is sealed: its record is closed
    ├── InternalError             500  a bug or an unforeseen failure inside the gateway (recorded all the same)
    ├── EngineFailed              502  the inference engine failed or answered with an error
    └── Unavailable               503  the call was not served; Retry-After says when to try again
        ├── RecordingFailed            Kafka did not acknowledge the call's event
        ├── HeldTooLong                held during a weight update past the configured bound
        ├── HistoryUnavailable         a rollout this process does not hold could not be read back from Kafka
        └── NoReplicaReady             no engine replica held the current weight version within the hold bound

Each class names its status and its error type in both protocols in one line;
the name differs from the event `schemas.events.RolloutSealed` on purpose.
"""

from __future__ import annotations

from typing import Any, ClassVar


class GatewayError(Exception):
    """Whatever went wrong, as each protocol's clients expect to see it; a bug unless a subclass says otherwise."""

    status: ClassVar[int] = 500
    openai_type: ClassVar[str] = "server_error"
    anthropic_type: ClassVar[str] = "api_error"

    def __init__(self, message: str, param: str | None = None, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.retry_after_s = retry_after_s

    def openai_body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.openai_type, "param": self.param,
                          "code": self.status}}

    def anthropic_body(self) -> dict[str, Any]:
        return {"type": "error", "error": {"type": self.anthropic_type, "message": self.message}}

    def headers(self) -> dict[str, str]:
        return {"retry-after": str(max(1, round(self.retry_after_s)))} if self.retry_after_s is not None else {}


class InvalidRequest(GatewayError):
    status, openai_type, anthropic_type = 400, "invalid_request_error", "invalid_request_error"


class BodyTooLarge(InvalidRequest):
    status, anthropic_type = 413, "request_too_large"


class Unauthorized(GatewayError):
    status, openai_type, anthropic_type = 401, "authentication_error", "authentication_error"


class Forbidden(GatewayError):
    status, openai_type, anthropic_type = 403, "permission_error", "permission_error"


class RolloutNotFound(GatewayError):
    status, openai_type, anthropic_type = 404, "not_found_error", "not_found_error"


class ResponseNotFound(GatewayError):
    status, openai_type, anthropic_type = 404, "not_found_error", "not_found_error"


class RolloutAlreadySealed(GatewayError):
    status, openai_type, anthropic_type = 409, "conflict_error", "invalid_request_error"


class InternalError(GatewayError):
    pass


class EngineFailed(GatewayError):
    status = 502


class Unavailable(GatewayError):
    status, openai_type, anthropic_type = 503, "service_unavailable", "overloaded_error"


class RecordingFailed(Unavailable):
    pass


class HeldTooLong(Unavailable):
    pass


class HistoryUnavailable(Unavailable):
    pass


class NoReplicaReady(Unavailable):
    pass
