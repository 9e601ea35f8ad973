"""The one place that maps exceptions to HTTP statuses and OpenAI's error body."""

from dataclasses import dataclass

from engine import errors


class APIError(Exception):
    """An error the server raises on purpose, already carrying its HTTP status."""

    status = 500
    type = "server_error"
    reject_reason: str | None = None

    def __init__(self, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


class BadRequest(APIError):
    status, type, reject_reason = 400, "invalid_request_error", "invalid"


class Unauthorized(APIError):
    status, type, reject_reason = 401, "invalid_request_error", "unauthorized"


class ModelNotFound(APIError):
    status, type, reject_reason = 404, "invalid_request_error", "invalid"


class NotFound(APIError):
    status, type = 404, "invalid_request_error"


class BodyTooLarge(APIError):
    status, type, reject_reason = 413, "invalid_request_error", "invalid"


class QueueFull(APIError):
    status, type, reject_reason = 429, "rate_limit_error", "queue_full"


class NotReady(APIError):
    status, type, reject_reason = 503, "service_unavailable_error", "not_ready"


class Unavailable(APIError):
    """503 for a request already admitted (drained, or the engine died under it): not a rejection."""

    status, type = 503, "service_unavailable_error"


class RequestTimeout(APIError):
    """--request-timeout elapsed: 504, as a gateway reports an upstream that took too long."""

    status, type = 504, "timeout_error"


GENERIC_MESSAGE = "The server had an error while processing your request."
RETRY_AFTER_S = 1


@dataclass(slots=True)
class Mapped:
    status: int
    body: dict
    reject_reason: str | None  # llm_requests_rejected_total / request.rejected reason, if any
    headers: dict[str, str]


def map_exception(exc: BaseException) -> Mapped:
    """Map any exception to (status, OpenAI error body); unknown ones become a generic 500."""
    if isinstance(exc, errors.PromptTooLongError):
        exc = _with_reason(BadRequest(str(exc), param=exc.param, code="context_length_exceeded"),
                           "prompt_too_long")
    elif isinstance(exc, errors.InvalidRequestError):
        exc = BadRequest(str(exc), param=exc.param)
    elif isinstance(exc, errors.QueueFullError):
        exc = QueueFull(str(exc) or "The waiting queue is full; retry later.", code="queue_full")
    elif isinstance(exc, errors.EngineDeadError):
        exc = NotReady(str(exc) or "The engine is dead.", code="engine_dead")
    if not isinstance(exc, APIError):
        body = {"error": {"message": GENERIC_MESSAGE, "type": "server_error", "param": None, "code": None}}
        return Mapped(500, body, None, {})
    body = {"error": {"message": exc.message, "type": exc.type, "param": exc.param, "code": exc.code}}
    headers = {"Retry-After": str(RETRY_AFTER_S)} if exc.status in (429, 503) else {}
    return Mapped(exc.status, body, exc.reject_reason, headers)


def _with_reason(exc: APIError, reason: str) -> APIError:
    exc.reject_reason = reason
    return exc

